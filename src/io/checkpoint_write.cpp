// Saving a checkpoint: collective creation of every dataset, collective writes of each rank's
// pieces, checksums, root attributes; then the atomic commit and retention on rank 0.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <regex>
#include <variant>

#include "checkpoint_common.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/version.hpp"

namespace meshtrain::io {

namespace fs = std::filesystem;

std::string describe(const SavedLayout& l) {
  return cat("dp ", l.dp, l.cp > 1 ? cat(" x cp ", l.cp) : std::string(), " x pp ", l.pp,
             " x tp ", l.tp, ", ZeRO ", l.zero);
}

std::string checkpoint_file_name(std::int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

namespace {

std::string iso8601_utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Root attributes as (name, value), built on rank 0 and broadcast so that every rank writes
// identical values (attribute writes are collective).
using AttrValue = std::variant<std::int64_t, std::uint64_t, double, std::string>;
using AttrList = std::vector<std::pair<std::string, AttrValue>>;

AttrList root_attributes(const CheckpointAttributes& a, std::int64_t step) {
  AttrList l;
  l.emplace_back("format", std::string(kCheckpointFormat));
  l.emplace_back("format_version", std::int64_t{kCheckpointVersion});
  l.emplace_back("description",
                 std::string("meshtrain GPT checkpoint. /model/<name>: parameters under "
                             "HuggingFace GPT-2 names and Conv1D layout ([in, out] weights), "
                             "float32 global tensors; transformer.wte.weight has "
                             "model.vocab_size real rows padded with zero rows to a multiple of "
                             "model.vocab_pad. /optim/exp_avg, /optim/exp_avg_sq: the AdamW "
                             "moments of each parameter, same names and shapes. Each tensor's "
                             "attribute 'checksum' is described by checksum_algorithm."));
  l.emplace_back("checksum_algorithm",
                 std::string("sum mod 2^64 over elements of fmix64((global_row_major_index * "
                             "0x9E3779B97F4A7C15) xor float32_bits), fmix64 = splitmix64 "
                             "finaliser"));
  l.emplace_back("step", step);
  l.emplace_back("tokens_seen", a.tokens_seen);
  l.emplace_back("seed", a.seed);
  l.emplace_back("loss_scale", a.loss_scale);
  l.emplace_back("loss_scale_good_steps", a.loss_scale_good_steps);
  l.emplace_back("loss_scale_skipped", a.loss_scale_skipped);
  l.emplace_back("config", a.config_text);
  l.emplace_back("model.name", a.model.name);
  for (const auto& k : ckpt::model_keys())
    l.emplace_back(k.attr, static_cast<std::int64_t>(a.model.*k.field));
  for (auto& [k, v] : ckpt::block_attributes(a.model)) l.emplace_back(k, v);
  l.emplace_back("layout.dp", std::int64_t{a.layout.dp});
  l.emplace_back("layout.pp", std::int64_t{a.layout.pp});
  l.emplace_back("layout.tp", std::int64_t{a.layout.tp});
  l.emplace_back("layout.zero", std::int64_t{a.layout.zero});
  l.emplace_back("layout.order", a.layout.order);
  l.emplace_back("layout.cp", std::int64_t{a.layout.cp});
  l.emplace_back("software_version", cat("meshtrain ", kVersion, " (", kBuildInfo, ")"));
  l.emplace_back("created", iso8601_utc_now());
  for (const auto& [k, v] : a.extra) l.emplace_back("extra." + k, v);
  return l;
}

// [u64 name length][name][u8 index][u64 value length][value bytes] per attribute.
std::string pack(const AttrList& l) {
  std::string s;
  auto put = [&](const void* p, std::size_t n) { s.append(static_cast<const char*>(p), n); };
  auto put_bytes = [&](const std::string& b) {
    const std::uint64_t n = b.size();
    put(&n, 8);
    s += b;
  };
  for (const auto& [name, v] : l) {
    put_bytes(name);
    const std::uint8_t idx = static_cast<std::uint8_t>(v.index());
    put(&idx, 1);
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, std::string>) put_bytes(x);
          else put_bytes(std::string(reinterpret_cast<const char*>(&x), sizeof x));
        },
        v);
  }
  return s;
}

AttrList unpack(const std::string& s) {
  AttrList l;
  std::size_t pos = 0;
  auto get_bytes = [&]() {
    std::uint64_t n;
    std::memcpy(&n, s.data() + pos, 8);
    pos += 8;
    std::string b = s.substr(pos, n);
    pos += n;
    return b;
  };
  while (pos < s.size()) {
    std::string name = get_bytes();
    const std::uint8_t idx = static_cast<std::uint8_t>(s[pos++]);
    const std::string b = get_bytes();
    AttrValue v;
    auto num = [&](auto x) {
      std::memcpy(&x, b.data(), sizeof x);
      return x;
    };
    if (idx == 0) v = num(std::int64_t{});
    else if (idx == 1) v = num(std::uint64_t{});
    else if (idx == 2) v = num(double{});
    else v = b;
    l.emplace_back(std::move(name), std::move(v));
  }
  return l;
}

void write_attrs(hid_t obj, const AttrList& l) {
  for (const auto& [name, v] : l) std::visit([&](const auto& x) { h5::write_attr(obj, name.c_str(), x); }, v);
}

const char* group_description(const std::string& prefix) {
  if (prefix == kModelPrefix) return "model parameters (float32 global tensors)";
  if (prefix == kExpAvgPrefix) return "AdamW first moment (exp_avg) of each parameter";
  if (prefix == kExpAvgSqPrefix) return "AdamW second moment (exp_avg_sq) of each parameter";
  return nullptr;
}

// Every rank must pass the same group prefixes and model (they decide which datasets exist).
void check_same_everywhere(MPI_Comm comm, const CheckpointAttributes& a,
                           const std::vector<SaveGroup>& groups) {
  std::string mine;
  for (const auto& g : groups) mine += g.prefix + "\n";
  for (const auto& k : ckpt::model_keys()) mine += std::to_string(a.model.*k.field) + " ";
  std::string root = mine;
  broadcast_string(comm, root);
  agree(comm, "save_checkpoint", [&] {
    MESHTRAIN_CHECK(root == mine, "every rank must pass the same group prefixes and model "
                                  "configuration (rank 0: '", root, "', this rank: '", mine, "')");
  });
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(cat("cannot open '", path, "' to sync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(cat("fsync of '", path, "' failed: ", std::strerror(err)));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) throw Error(cat("cannot rename '", from, "' to '", to, "': ", ec.message()));
}

// Deletes complete checkpoints beyond the newest `keep`, and step_*.h5.tmp files that crashed
// saves left behind (the one of this save has been renamed already).
void apply_retention(const std::string& dir, int keep) {
  static const std::regex done(R"(step_(\d+)\.h5)"), partial(R"(step_\d+\.h5\.tmp)");
  std::vector<std::pair<long long, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, done)) complete.emplace_back(std::stoll(m[1].str()), e.path());
    else if (std::regex_match(name, partial)) fs::remove(e.path());
  }
  if (keep <= 0 || complete.size() <= static_cast<std::size_t>(keep)) return;
  std::sort(complete.begin(), complete.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < complete.size(); ++i)
    fs::remove(complete[i].second);
}

// Root attributes, groups and datasets (collectively, before any data), then the data.
void write_datasets(hid_t file, const AttrList& root_attrs, const CheckpointState& state,
                    bool root, const model::ParameterRegistry& full,
                    const std::vector<SaveGroup>& groups,
                    const std::vector<std::vector<std::vector<int>>>& plan,
                    const std::vector<std::vector<ckpt::TensorTransfer>>& how,
                    const std::vector<std::uint64_t>& sums, std::vector<h5::Handle>& dsets) {
  const std::size_t n = full.params().size();
  write_attrs(file, root_attrs);

  // Every dataset, collectively, before any data: contiguous, allocated at creation, never
  // filled (every element is written below, so filling would write the file twice).
  h5::Handle lcpl(MESHTRAIN_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  MESHTRAIN_H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  h5::Handle dcpl(MESHTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  MESHTRAIN_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  MESHTRAIN_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string gpath = "/" + groups[g].prefix;
    h5::Handle grp(MESHTRAIN_H5_CHECK(H5Gcreate2(file, gpath.c_str(), lcpl, H5P_DEFAULT,
                                                 H5P_DEFAULT)),
                   H5Gclose);
    if (const char* d = group_description(groups[g].prefix))
      h5::write_attr(grp, "description", std::string(d));
    for (std::size_t t = 0; t < n; ++t) {
      const auto& p = full.params()[t];
      std::vector<hsize_t> dims(p.global_shape.begin(), p.global_shape.end());
      h5::Handle space(MESHTRAIN_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()),
                                                           dims.data(), nullptr)),
                       H5Sclose);
      h5::Handle d(MESHTRAIN_H5_CHECK(H5Dcreate2(grp, p.name.c_str(), H5T_IEEE_F32LE, space,
                                                 H5P_DEFAULT, dcpl, H5P_DEFAULT)),
                   H5Dclose);
      h5::write_attr(d, "checksum", sums[2 * (g * n + t) + 1]);
      dsets.push_back(std::move(d));
    }
  }

  // Data, tensor by tensor (ckpt::transfer: collectively, or independently where every rank's
  // part is one contiguous run).
  h5::Handle coll = ckpt::transfer_list(true), indep = ckpt::transfer_list(false);
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t t = 0; t < n; ++t)
      ckpt::transfer(dsets[g * n + t], how[g][t], plan[g][t], groups[g].pieces, groups[g].data,
                     coll, indep);
  ckpt::write_state(file, state, root, coll);
}


}  // namespace

CheckpointWriter::CheckpointWriter(MPI_Comm comm, std::string dir, std::int64_t step)
    : comm_(comm), dir_(std::move(dir)), step_(step) {
  MESHTRAIN_CHECK(step >= 0, "checkpoint step ", step, " is negative");
  final_ = (fs::path(dir_) / checkpoint_file_name(step)).string();
  tmp_ = final_ + ".tmp";
}

void CheckpointWriter::write(const CheckpointAttributes& attrs,
                             const std::vector<SaveGroup>& groups, Transfer transfer) {
  h5::Silence quiet;
  MESHTRAIN_CHECK(!written_, "CheckpointWriter::write called twice for ", tmp_);
  const std::string where = cat("checkpoint '", tmp_, "'");
  check_same_everywhere(comm_, attrs, groups);
  std::string packed = pack(root_attributes(attrs, step_));
  broadcast_string(comm_, packed);
  const AttrList root_attrs = unpack(packed);
  CheckpointState state = attrs.state;
  ckpt::broadcast_state(comm_, state);
  int rank = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm_, &rank));

  const model::ParameterRegistry full = ckpt::full_registry(attrs.model);
  const std::size_t n = full.params().size();

  // Which of this rank's pieces go to which tensor, and the checksums (one all-reduce for the
  // whole file).
  std::vector<std::vector<std::vector<int>>> plan(groups.size());
  std::vector<std::uint64_t> sums(2 * n * groups.size(), 0);  // [group][tensor] count, checksum
  // The checksums take each rank as long as its share of the data: the ranks meet in a quiet
  // barrier (a background writer waiting for slower ranks leaves its core to training).
  const auto count_and_sum = [&] {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const SaveGroup& G = groups[g];
      MESHTRAIN_CHECK(G.data.size() == G.pieces.size(), "checkpoint group '", G.prefix, "' has ",
                      G.pieces.size(), " pieces but ", G.data.size(), " data pointers");
      std::vector<TensorPiece> primary;
      std::vector<int> origin;
      for (std::size_t i = 0; i < G.pieces.size(); ++i)
        if (G.pieces[i].primary) primary.push_back(G.pieces[i]), origin.push_back(static_cast<int>(i));
      plan[g] = ckpt::pieces_by_tensor(full, primary, G.prefix);
      for (std::size_t t = 0; t < n; ++t) {
        for (int& i : plan[g][t]) {
          i = origin[static_cast<std::size_t>(i)];
          const TensorPiece& pc = G.pieces[static_cast<std::size_t>(i)];
          MESHTRAIN_CHECK(G.data[static_cast<std::size_t>(i)] != nullptr, "checkpoint group '",
                          G.prefix, "': no data for the piece of ", pc.param->name);
          sums[2 * (g * n + t)] += pc.count;
          sums[2 * (g * n + t) + 1] += piece_checksum(pc, G.data[static_cast<std::size_t>(i)]);
        }
      }
    }
  };
  agree(comm_, where, [&] {
    std::exception_ptr failed;
    try {
      count_and_sum();
    } catch (...) {
      failed = std::current_exception();
    }
    quiet_barrier(comm_);
    if (failed) std::rethrow_exception(failed);
  });
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()),
                                    MPI_UINT64_T, MPI_SUM, comm_));
  std::vector<std::vector<ckpt::TensorTransfer>> how;
  for (std::size_t g = 0; g < groups.size(); ++g)
    how.push_back(ckpt::plan_transfers(comm_, plan[g], groups[g].pieces, transfer));
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t t = 0; t < n; ++t) {
      const auto& p = full.params()[t];
      const std::uint64_t got = sums[2 * (g * n + t)];
      // Identical on every rank (all-reduced), so every rank throws.
      MESHTRAIN_CHECK(got == static_cast<std::uint64_t>(p.global_numel()), where, ": the ranks' "
                      "primary pieces of ", ckpt::dataset_path(groups[g].prefix, p.name), " hold ",
                      got, " elements, the tensor has ", p.global_numel(), " (each element must "
                      "be written once: pass each data-parallel rank its own partition range)");
    }

  agree_on_root(comm_, where, [&] {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw ConfigError(cat("cannot create the checkpoint directory '", dir_, "': ",
                                  ec.message()));
  });

  h5::Handle fapl = ckpt::mpio_access(comm_);
  h5::Handle file;
  agree(comm_, where, [&] {
    file = h5::Handle(MESHTRAIN_H5_CHECK(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)),
                      H5Fclose);
  });
  std::vector<h5::Handle> dsets;
  // A failed write (a full disk, a quota, an I/O error) names the file and the cause; the
  // checkpoint is not committed, so `latest` still names the previous one.
  auto failed = [&](const std::exception& e) {
    std::remove(tmp_.c_str());
    return Error(cat(where, ": writing failed: ", e.what(), " (no space left on the device or "
                     "over a quota? the checkpoint was not committed: ", dir_,
                     "/latest still names the previous one)"));
  };
  try {
    write_datasets(file, root_attrs, state, rank == 0, full, groups, plan, how, sums, dsets);
  } catch (const AgreedTag&) {
    throw;  // every rank is unwinding: the handles close collectively
  } catch (const std::exception& e) {
    for (auto& d : dsets) d.release();
    file.release();
    throw failed(e);
  }
  dsets.clear();
  if (before_close_) before_close_();
  quiet_barrier(comm_);  // the close waits for the rank with the most data
  try {
    file.close(where.c_str());  // collective: where buffered metadata reaches the disk
  } catch (const std::exception& e) {
    throw failed(e);
  }
  written_ = true;
}

std::string CheckpointWriter::commit(int keep) {
  MESHTRAIN_CHECK(written_, "CheckpointWriter::commit before write for ", tmp_);
  // Every rank has closed the file (H5Fclose is collective); rank 0 makes it durable before the
  // rename, so a crash can never leave a final name on incomplete data, and only then points
  // `latest` at it.
  // The others wait in a quiet barrier while rank 0 works (fsync of a large file takes long),
  // then every rank learns its outcome.
  int rank = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  std::exception_ptr failed;
  if (rank == 0) try {
    fsync_path(tmp_, false);
    rename_or_throw(tmp_, final_);
    fsync_path(dir_, true);
    const std::string latest = (fs::path(dir_) / "latest").string();
    {
      std::ofstream out(latest + ".tmp", std::ios::trunc);
      out << checkpoint_file_name(step_) << "\n";
      out.close();
      if (!out) throw Error(cat("cannot write '", latest, ".tmp'"));
    }
    fsync_path(latest + ".tmp", false);
    rename_or_throw(latest + ".tmp", latest);
    fsync_path(dir_, true);
    apply_retention(dir_, keep);
  } catch (...) {
    failed = std::current_exception();
  }
  quiet_barrier(comm_);
  agree_on_root(comm_, cat("checkpoint commit in '", dir_, "'"), [&] {
    if (failed) std::rethrow_exception(failed);
  });
  return final_;
}

std::string save_checkpoint(MPI_Comm comm, const std::string& dir, std::int64_t step,
                            const CheckpointAttributes& attrs, const std::vector<SaveGroup>& groups,
                            int keep, Transfer transfer) {
  CheckpointWriter w(comm, dir, step);
  w.write(attrs, groups, transfer);
  return w.commit(keep);
}

}  // namespace meshtrain::io
