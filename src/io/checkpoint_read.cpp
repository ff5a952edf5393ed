// Restoring a checkpoint into any layout: resolve the file, check its model against the
// configuration, read each rank's pieces collectively, verify the layout-free checksums.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint_common.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/io/safetensors.hpp"

namespace meshtrain::io {

namespace fs = std::filesystem;

namespace {

// HDF5 failing to read a file's own structure (the superblock, an object header, an attribute
// message, a B-tree) means the file is damaged, which is bad input (ConfigError, exit 2) and not
// a failure of the program: the message names the file and carries HDF5's cause.
template <class F>
void reading(const std::string& where, F&& f) {
  try {
    f();
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(cat(where, " is damaged (its HDF5 metadata cannot be read): ", e.what(),
                          "; restore another step_XXXXXXXX.h5"));
  }
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string from_latest(const fs::path& latest) {
  if (!fs::exists(latest))
    throw ConfigError(cat("no checkpoint to resume from: '", latest.string(), "' does not exist (",
                          latest.parent_path().string(), " holds no committed checkpoint; start "
                          "without resuming, or name a step_XXXXXXXX.h5 file)"));
  std::ifstream in(latest);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string name = trim(ss.str());
  if (!in || name.empty())
    throw ConfigError(cat("'", latest.string(), "' is empty or unreadable; name a "
                          "step_XXXXXXXX.h5 file of that directory instead"));
  const fs::path target = latest.parent_path() / name;
  if (!fs::is_regular_file(target))
    throw ConfigError(cat("'", latest.string(), "' names ", name, ", which does not exist in ",
                          latest.parent_path().string(), "; name another step_XXXXXXXX.h5 file"));
  return target.string();
}

std::string resolve_local(const std::string& spec, const std::string& dir) {
  if (spec == "latest") {
    if (dir.empty())
      throw ConfigError("resuming from 'latest' needs the checkpoint directory (ckpt.dir)");
    return from_latest(fs::path(dir) / "latest");
  }
  if (fs::is_directory(spec)) return from_latest(fs::path(spec) / "latest");
  if (fs::path(spec).filename() == "latest" && fs::is_regular_file(spec)) return from_latest(spec);
  if (fs::is_regular_file(spec)) return spec;
  if (!dir.empty() && fs::is_regular_file(fs::path(dir) / spec)) return (fs::path(dir) / spec).string();
  throw ConfigError(cat("checkpoint '", spec, "' does not exist (name a step_XXXXXXXX.h5 file, a "
                        "checkpoint directory or 'latest')"));
}

CheckpointAttributes read_root(hid_t file, const std::string& where) {
  using namespace h5;
  CheckpointAttributes a;
  if (!has_attr(file, "format") || read_attr_string(file, "format", where) != kCheckpointFormat)
    throw ConfigError(cat(where, " is an HDF5 file but not a ", kCheckpointFormat,
                          " (its root has no attribute format = \"", kCheckpointFormat, "\")"));
  a.format = kCheckpointFormat;
  a.format_version = static_cast<int>(read_attr_i64(file, "format_version", where));
  if (a.format_version > kCheckpointVersion)
    throw ConfigError(cat(where, " has format version ", a.format_version, "; this meshtrain reads "
                          "versions up to ", kCheckpointVersion, " (use a newer meshtrain)"));
  a.step = read_attr_i64(file, "step", where);
  a.tokens_seen = read_attr_i64(file, "tokens_seen", where);
  a.seed = read_attr_u64(file, "seed", where);
  a.loss_scale = read_attr_f64(file, "loss_scale", where);
  a.loss_scale_good_steps = read_attr_i64(file, "loss_scale_good_steps", where);
  a.loss_scale_skipped = read_attr_i64(file, "loss_scale_skipped", where);
  a.config_text = read_attr_string(file, "config", where);
  a.model.name = read_attr_string(file, "model.name", where);
  for (const auto& k : ckpt::model_keys())
    a.model.*k.field = static_cast<int>(read_attr_i64(file, k.attr, where));
  for (const auto& kv : ckpt::block_attributes(a.model))  // absent: an older file, GPT-2
    if (has_attr(file, kv.first.c_str()))
      ckpt::set_block_attribute(a.model, kv.first,
                                read_attr_string(file, kv.first.c_str(), where), where);
  a.layout.dp = static_cast<int>(read_attr_i64(file, "layout.dp", where));
  a.layout.pp = static_cast<int>(read_attr_i64(file, "layout.pp", where));
  a.layout.tp = static_cast<int>(read_attr_i64(file, "layout.tp", where));
  a.layout.zero = static_cast<int>(read_attr_i64(file, "layout.zero", where));
  a.layout.order = read_attr_string(file, "layout.order", where);
  if (has_attr(file, "layout.cp"))
    a.layout.cp = static_cast<int>(read_attr_i64(file, "layout.cp", where));
  a.software_version = read_attr_string(file, "software_version", where);
  a.created = read_attr_string(file, "created", where);
  // Free-form attributes: every root attribute named extra.<key>.
  H5O_info_t info;
  MESHTRAIN_H5_CHECK(H5Oget_info2(file, &info, H5O_INFO_NUM_ATTRS));
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    const ssize_t len = MESHTRAIN_H5_CHECK(
        H5Aget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    MESHTRAIN_H5_CHECK(H5Aget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                          name.size(), H5P_DEFAULT));
    name.resize(static_cast<std::size_t>(len));
    if (name.rfind("extra.", 0) == 0)
      a.extra[name.substr(6)] = read_attr_string(file, name.c_str(), where);
  }
  return a;
}

void check_model(const model::GptConfig& saved, const model::GptConfig& now,
                 const std::string& where) {
  for (const auto& k : ckpt::model_keys()) {
    if (std::string(k.attr) == "model.vocab_pad") continue;  // only the padded row count matters
    if (saved.*k.field != now.*k.field)
      throw ConfigError(cat(where, " was saved with ", k.attr, "=", saved.*k.field,
                            " but the configuration has ", k.attr, "=", now.*k.field,
                            " (a checkpoint restores the same model only: set ", k.attr, "=",
                            saved.*k.field, " or start a new run)"));
  }
  const auto a = ckpt::block_attributes(saved), b = ckpt::block_attributes(now);
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].second != b[i].second)
      throw ConfigError(cat(where, " was saved with ", a[i].first, "=", a[i].second,
                            " but the configuration has ", b[i].first, "=", b[i].second,
                            " (a checkpoint restores the same model only: set ", a[i].first, "=",
                            a[i].second, " or start a new run)"));
  if (saved.padded_vocab() != now.padded_vocab())
    throw ConfigError(cat(where, " was saved with model.vocab_pad=", saved.vocab_pad, " (",
                          saved.padded_vocab(), " rows of wte) but the configuration has "
                          "model.vocab_pad=", now.vocab_pad, " (", now.padded_vocab(),
                          " rows); set model.vocab_pad=", saved.vocab_pad));
}

bool path_exists(hid_t file, const std::string& path) {
  // H5Lexists needs every parent to exist: check the path component by component.
  std::size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos)
    if (MESHTRAIN_H5_CHECK(H5Lexists(file, path.substr(0, pos).c_str(), H5P_DEFAULT)) <= 0)
      return false;
  return MESHTRAIN_H5_CHECK(H5Lexists(file, path.c_str(), H5P_DEFAULT)) > 0;
}

// Opens /prefix/name and checks its shape; ConfigError naming the tensor and the file.
h5::Handle open_tensor(hid_t file, const std::string& prefix, const model::ParamInfo& p,
                       const std::string& where) {
  const std::string path = ckpt::dataset_path(prefix, p.name);
  if (!path_exists(file, path))
    throw ConfigError(cat(where, " has no tensor ", path, prefix == kModelPrefix ? "" :
                          " (saved without optimizer state? resume the weights alone)"));
  h5::Handle d(MESHTRAIN_H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT)), H5Dclose);
  h5::Handle s(MESHTRAIN_H5_CHECK(H5Dget_space(d)), H5Sclose);
  const int nd = MESHTRAIN_H5_CHECK(H5Sget_simple_extent_ndims(s));
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(nd, 0)));
  MESHTRAIN_H5_CHECK(H5Sget_simple_extent_dims(s, dims.data(), nullptr));
  const std::vector<std::int64_t> got(dims.begin(), dims.end());
  if (got != p.global_shape) {
    auto str = [](const std::vector<std::int64_t>& v) {
      std::ostringstream os;
      for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
      return os.str();
    };
    throw ConfigError(cat(where, ": tensor ", path, " has shape [", str(got), "], the model needs [",
                          str(p.global_shape), "]"));
  }
  return d;
}

// The checksum of a whole tensor read in even slices of rows over the ranks (used when the
// caller's primary pieces do not cover the tensor exactly once).
std::uint64_t reread_checksum(MPI_Comm comm, hid_t d, const model::ParamInfo& p, hid_t coll) {
  int rank = 0, size = 1;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(comm, &size));
  const std::int64_t rows = p.global_shape[0];  // a 1-D tensor: rows of one element
  const std::int64_t row_len = p.global_numel() / std::max<std::int64_t>(rows, 1);
  const std::int64_t lo = rows * rank / size, hi = rows * (rank + 1) / size;
  TensorPiece pc{&p, 0, 1, static_cast<std::size_t>(lo * row_len),
                 static_cast<std::size_t>((hi - lo) * row_len), true};
  std::vector<float> buf(std::max<std::size_t>(pc.count, 1));
  const std::vector<TensorPiece> pieces{pc};
  const std::vector<float*> data{buf.data()};
  ckpt::transfer(d, ckpt::TensorTransfer{1, false},
                 pc.count > 0 ? std::vector<int>{0} : std::vector<int>{}, pieces, data, coll, coll);
  std::uint64_t sum = pc.count > 0 ? piece_checksum(pc, buf.data()) : 0;
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, comm));
  return sum;
}

void load_group(MPI_Comm comm, hid_t file, const model::ParameterRegistry& full,
                const LoadGroup& G, bool verify, Transfer transfer, const std::string& where,
                std::vector<h5::Handle>& dsets) {
  const std::size_t n = full.params().size();
  std::vector<std::vector<int>> plan;
  std::vector<std::uint64_t> sums(2 * n, 0), stored(n, 0);
  agree(comm, "", [&] {
    MESHTRAIN_CHECK(G.data.size() == G.pieces.size(), "checkpoint group '", G.prefix, "' has ",
                    G.pieces.size(), " pieces but ", G.data.size(), " destinations");
    plan = ckpt::pieces_by_tensor(full, G.pieces, G.prefix);
    reading(where, [&] {
      for (std::size_t t = 0; t < n; ++t) {
        dsets.push_back(open_tensor(file, G.prefix, full.params()[t], where));
        if (verify) stored[t] = h5::read_attr_u64(dsets.back(), "checksum", where);
      }
    });
  });
  const auto how = ckpt::plan_transfers(comm, plan, G.pieces, transfer);
  h5::Handle coll = ckpt::transfer_list(true), indep = ckpt::transfer_list(false);
  // Not agreed: a collective read may be under way on the other ranks (the job aborts).
  reading(where, [&] {
    for (std::size_t t = 0; t < n; ++t)
      ckpt::transfer(dsets[t], how[t], plan[t], G.pieces, G.data, coll, indep);
  });
  if (!verify) return;

  for (std::size_t t = 0; t < n; ++t)
    for (int i : plan[t]) {
      const TensorPiece& pc = G.pieces[static_cast<std::size_t>(i)];
      if (!pc.primary) continue;
      sums[2 * t] += pc.count;
      sums[2 * t + 1] += piece_checksum(pc, G.data[static_cast<std::size_t>(i)]);
    }
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()),
                                    MPI_UINT64_T, MPI_SUM, comm));
  std::vector<std::string> bad;
  for (std::size_t t = 0; t < n; ++t) {
    const auto& p = full.params()[t];
    // Only a tensor whose primary pieces hold every element once gives its checksum for free.
    const bool exact = sums[2 * t] == static_cast<std::uint64_t>(p.global_numel());
    const std::uint64_t got = exact ? sums[2 * t + 1] : reread_checksum(comm, dsets[t], p, coll);
    if (got != stored[t]) bad.push_back(ckpt::dataset_path(G.prefix, p.name));
  }
  if (!bad.empty())
    throw Agreed<ConfigError>(cat(
        where, " is corrupt: the checksum of tensor ", bad[0], " does not match its data",
        bad.size() > 1 ? cat(" (and of ", bad.size() - 1, " more tensors)") : std::string(),
        "; restore an earlier checkpoint"));
}

}  // namespace

std::string resolve_checkpoint(MPI_Comm comm, const std::string& spec, const std::string& dir) {
  std::string path;
  agree_on_root(comm, "", [&] { path = resolve_local(spec, dir); });
  broadcast_string(comm, path);
  return path;
}

CheckpointAttributes load_checkpoint(MPI_Comm comm, const std::string& spec,
                                     const model::GptConfig& current,
                                     const std::vector<LoadGroup>& groups, bool verify,
                                     const std::string& dir, Transfer transfer) {
  h5::Silence quiet;
  const std::string path = resolve_checkpoint(comm, spec, dir);
  const std::string where = cat("checkpoint '", path, "'");
  h5::Handle fapl = ckpt::mpio_access(comm);
  h5::Handle file;
  agree(comm, "", [&] {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    if (f < 0)
      throw ConfigError(cat(where, " cannot be read as an HDF5 file: ", h5::error_stack(),
                            " (truncated by a crash or a full disk, or not a checkpoint; restore "
                            "another step_XXXXXXXX.h5)"));
    file = h5::Handle(f, H5Fclose);
  });
  CheckpointAttributes attrs;
  std::vector<h5::Handle> dsets;
  try {
    agree(comm, "", [&] {
      reading(where, [&] {
        attrs = read_root(file, where);
        attrs.state = ckpt::read_state(file, where, verify);
      });
      check_model(attrs.model, current, where);
    });
    attrs.path = path;
    const model::ParameterRegistry full = ckpt::full_registry(current);
    for (const auto& G : groups) {
      load_group(comm, file, full, G, verify, transfer, where, dsets);
      dsets.clear();
    }
  } catch (const AgreedTag&) {
    throw;
  } catch (...) {
    for (auto& d : dsets) d.release();
    file.release();
    throw;
  }
  file.close(where.c_str());
  return attrs;
}

namespace {

// The default (POSIX) driver: one process reads the file, no MPI involved.
h5::Handle open_alone(const std::string& checkpoint, const std::string& where) {
  if (!fs::is_regular_file(checkpoint))
    throw ConfigError(cat(where, " does not exist"));
  const hid_t f = H5Fopen(checkpoint.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0)
    throw ConfigError(cat(where, " cannot be read as an HDF5 file: ", h5::error_stack()));
  return h5::Handle(f, H5Fclose);
}

}  // namespace

CheckpointAttributes read_checkpoint_attributes(const std::string& checkpoint) {
  h5::Silence quiet;
  const std::string where = cat("checkpoint '", checkpoint, "'");
  h5::Handle file = open_alone(checkpoint, where);
  CheckpointAttributes attrs = read_root(file, where);
  attrs.state = ckpt::read_state(file, where, true);
  attrs.path = checkpoint;
  return attrs;
}

model::GptConfig export_hf_from_checkpoint(const std::string& checkpoint, const std::string& dir,
                                           const HfExportOptions& opt) {
  h5::Silence quiet;
  const std::string where = cat("checkpoint '", checkpoint, "'");
  h5::Handle file = open_alone(checkpoint, where);
  const CheckpointAttributes attrs = read_root(file, where);
  // One tensor at a time: read, verify its checksum, append (the writer streams it to its
  // shard), so the conversion needs one tensor of memory, never the model.
  HfFolderWriter w(attrs.model, dir, opt);
  const model::ParameterRegistry full = ckpt::full_registry(attrs.model);
  for (const auto& p : w.registry().params()) {
    const model::ParamInfo& fp = full.get(p.name);
    h5::Handle d = open_tensor(file, kModelPrefix, fp, where);
    std::vector<float> v(static_cast<std::size_t>(fp.global_numel()));
    MESHTRAIN_H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
    const TensorPiece whole{&fp, 0, 1, 0, v.size(), true};
    if (piece_checksum(whole, v.data()) != h5::read_attr_u64(d, "checksum", where))
      throw ConfigError(cat(where, " is corrupt: the checksum of tensor ",
                            ckpt::dataset_path(kModelPrefix, p.name), " does not match its data"));
    w.append(p, v.data());
  }
  w.finish();
  return attrs.model;
}

}  // namespace meshtrain::io
