// Sharded HuggingFace safetensors folders (safetensors_sharded.hpp): a slice reader over pread
// and a streaming writer. Shard headers are parsed by SafetensorsReader (safetensors.cpp), so
// the format's rules (tiling data offsets, dtype sizes, header limits) are checked in one place.
#include "meshtrain/io/safetensors_sharded.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "float16.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"

namespace meshtrain::io {

namespace fs = std::filesystem;

namespace {

// A JSON string literal (quotes and escapes) for the hand-laid headers and index, whose byte
// layout the tests and HF's readers expect.
std::string quoted(const std::string& v) { return Json(v).dump(); }

constexpr std::size_t kMaxRun = std::size_t(16) << 20;  // bytes per pread of a row range

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += cat(i ? ", " : "", s[i]);
  return t + "]";
}

int element_size(const std::string& dtype) {
  return dtype == "F32" ? 4 : (dtype == "F16" || dtype == "BF16") ? 2 : 0;
}

// n source elements of dtype `src` at `in` -> `as` at out + offset elements.
void convert(const std::string& src, const char* in, std::size_t n, SliceType as, void* out,
             std::size_t offset) {
  if (as == SliceType::f32) {
    float* o = static_cast<float*>(out) + offset;
    if (src == "F32") {
      std::memcpy(o, in, n * 4);
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      o[i] = src == "BF16" ? detail::bf16_to_float(h) : detail::half_to_float(h);
    }
    return;
  }
  std::uint16_t* o = static_cast<std::uint16_t*>(out) + offset;
  if (src == "BF16") {
    std::memcpy(o, in, n * 2);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    float f;
    if (src == "F32") {
      std::memcpy(&f, in + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      f = detail::half_to_float(h);
    }
    o[i] = detail::float_to_bf16(f);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(cat("cannot open '", path, "': ", std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------------------- reader
struct ShardedSafetensorsReader::Shard {
  std::string path;
  SafetensorsReader header;
  int fd = -1;
  explicit Shard(const std::string& p) : path(p), header(p) {
    fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw ConfigError(cat("safetensors file '", p, "' cannot be opened: ", std::strerror(errno)));
  }
  ~Shard() {
    if (fd >= 0) ::close(fd);
  }
};

ShardedSafetensorsReader::ShardedSafetensorsReader(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(index)) {
    if (!fs::exists(single))
      throw ConfigError(cat("'", dir,
                            "' has neither model.safetensors.index.json nor "
                            "model.safetensors (not a HuggingFace checkpoint folder?)"));
    shards_.push_back(std::make_unique<Shard>(single.string()));
    for (const auto& [name, info] : shards_[0]->header.tensors()) where_[name] = Loc{0, &info};
    return;
  }
  const std::string ip = index.string();
  const Json j = json::parse(read_text(ip), ip);
  const Json& map = json::at(j, "weight_map", ip);
  if (!map.is_object()) throw ConfigError(cat(ip, ": weight_map is not an object"));
  std::map<std::string, std::size_t> shard_index;
  for (const auto& [name, v] : map.items()) {
    const std::string file = json::as_string(v, cat(ip, ": weight_map['", name, "']"));
    if (file.find('/') != std::string::npos || file.empty())
      throw ConfigError(cat(ip, ": tensor '", name, "' is in shard '", file,
                            "', which is not a file name in the folder"));
    auto it = shard_index.find(file);
    if (it == shard_index.end()) {
      const fs::path p = fs::path(dir) / file;
      if (!fs::exists(p))
        throw ConfigError(cat(ip, ": tensor '", name, "' is in shard '", file, "', and ",
                              p.string(), " does not exist (an incomplete download?)"));
      shards_.push_back(std::make_unique<Shard>(p.string()));
      it = shard_index.emplace(file, shards_.size() - 1).first;
    }
    const Shard& s = *shards_[it->second];
    if (!s.header.has(name))
      throw ConfigError(cat(s.path, " has no tensor '", name, "', which ", ip, " puts there"));
    where_[name] = Loc{it->second, &s.header.info(name)};
  }
  // A tensor that a shard holds but the index does not name (or names in another shard) makes
  // the folder ambiguous: refuse it.
  for (std::size_t k = 0; k < shards_.size(); ++k)
    for (const auto& [name, info] : shards_[k]->header.tensors()) {
      auto it = where_.find(name);
      if (it == where_.end())
        throw ConfigError(cat(shards_[k]->path, ": tensor '", name, "' is not in ", ip));
      if (it->second.shard != k)
        throw ConfigError(cat(shards_[k]->path, ": tensor '", name, "' is also in ",
                              shards_[it->second.shard]->path, " (", ip, " names that one)"));
    }
}

ShardedSafetensorsReader::~ShardedSafetensorsReader() = default;

std::vector<std::string> ShardedSafetensorsReader::names() const {
  std::vector<std::string> n;
  for (const auto& [name, l] : where_) n.push_back(name);
  return n;
}

const ShardedSafetensorsReader::Loc& ShardedSafetensorsReader::loc(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw ConfigError(cat("the checkpoint '", dir_, "' has no tensor '", name, "'"));
  return it->second;
}
const TensorInfo& ShardedSafetensorsReader::info(const std::string& name) const {
  return *loc(name).info;
}
const std::string& ShardedSafetensorsReader::file_of(const std::string& name) const {
  return shards_[loc(name).shard]->path;
}

void ShardedSafetensorsReader::expect(const std::string& name,
                                      const std::vector<std::int64_t>& shape) const {
  const TensorInfo& t = info(name);
  if (t.shape != shape)
    throw ConfigError(cat(file_of(name), ": tensor '", name, "' has shape ", shape_text(t.shape),
                          ", the model needs ", shape_text(shape),
                          " (check config.json against the weights)"));
  if (element_size(t.dtype) == 0)
    throw ConfigError(cat(file_of(name), ": tensor '", name, "' has dtype ", t.dtype,
                          "; expected F32, F16 or BF16"));
}

void ShardedSafetensorsReader::pread_at(const Shard& s, std::uint64_t offset, std::size_t n,
                                        char* buf, const std::string& tensor) const {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(s.fd, buf + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw ConfigError(cat(s.path, ": reading tensor '", tensor, "' (", n, " bytes at byte ",
                            offset, ") failed: ", r < 0 ? std::strerror(errno) : "file truncated"));
    done += static_cast<std::size_t>(r);
  }
  bytes_read_ += n;
  ++reads_;
}

namespace {
// Elements of one "row" (one index along dim 0): the product of the other dimensions (a 3-D
// tensor [E, n, C] is read by slabs [n, C]).
std::int64_t row_elements(const std::vector<std::int64_t>& shape) {
  std::int64_t c = 1;
  for (std::size_t k = 1; k < shape.size(); ++k) c *= shape[k];
  return c;
}
}  // namespace

void ShardedSafetensorsReader::read_rows(const std::string& name, std::int64_t r0, std::int64_t r1,
                                         SliceType as, void* out) const {
  const Loc& l = loc(name);
  const TensorInfo& t = *l.info;
  const Shard& s = *shards_[l.shard];
  const int es = element_size(t.dtype);
  if (es == 0 || t.shape.empty())
    throw ConfigError(cat(s.path, ": tensor '", name, "' (", t.dtype, ", shape ",
                          shape_text(t.shape),
                          ") cannot be read by rows: F32, F16 or BF16 of 1 or more "
                          "dimensions"));
  const std::int64_t R = t.shape[0], C = row_elements(t.shape);
  if (!(0 <= r0 && r0 <= r1 && r1 <= R))
    throw ConfigError(cat(s.path, ": rows [", r0, ", ", r1, ") of tensor '", name,
                          "' lie outside its ", R, " rows"));
  const std::size_t total = std::size_t(r1 - r0) * C;  // elements
  const std::size_t per = std::max<std::size_t>(1, kMaxRun / es);
  std::vector<char> buf(std::min(total, per) * es);
  const std::uint64_t base = s.header.data_start() + t.begin + std::uint64_t(r0) * C * es;
  for (std::size_t done = 0; done < total;) {
    const std::size_t n = std::min(per, total - done);
    pread_at(s, base + done * es, n * es, buf.data(), name);
    convert(t.dtype, buf.data(), n, as, out, done);
    done += n;
  }
}

void ShardedSafetensorsReader::read_cols(const std::string& name, std::int64_t c0, std::int64_t c1,
                                         SliceType as, void* out) const {
  const Loc& l = loc(name);
  const TensorInfo& t = *l.info;
  const Shard& s = *shards_[l.shard];
  const int es = element_size(t.dtype);
  if (es == 0 || t.shape.size() != 2)
    throw ConfigError(cat(s.path, ": tensor '", name, "' (", t.dtype, ", shape ",
                          shape_text(t.shape),
                          ") cannot be read by columns: F32, F16 or BF16 of 2 "
                          "dimensions"));
  const std::int64_t R = t.shape[0], C = t.shape[1];
  if (!(0 <= c0 && c0 <= c1 && c1 <= C))
    throw ConfigError(cat(s.path, ": columns [", c0, ", ", c1, ") of tensor '", name,
                          "' lie outside its ", C, " columns"));
  if (c0 == 0 && c1 == C) {  // whole rows: contiguous
    read_rows(name, 0, R, as, out);
    return;
  }
  const std::size_t w = std::size_t(c1 - c0);
  std::vector<char> buf(w * es);
  const std::uint64_t base = s.header.data_start() + t.begin;
  for (std::int64_t r = 0; r < R && w > 0; ++r) {
    pread_at(s, base + (std::uint64_t(r) * C + c0) * es, w * es, buf.data(), name);
    convert(t.dtype, buf.data(), w, as, out, std::size_t(r) * w);
  }
}

std::vector<float> ShardedSafetensorsReader::read_rows_f32(const std::string& name, std::int64_t r0,
                                                           std::int64_t r1) const {
  const TensorInfo& t = info(name);
  const std::int64_t C = t.shape.empty() ? 1 : row_elements(t.shape);
  std::vector<float> v(std::size_t(std::max<std::int64_t>(r1 - r0, 0)) * C);
  read_rows(name, r0, r1, SliceType::f32, v.data());
  return v;
}

std::vector<float> ShardedSafetensorsReader::read_cols_f32(const std::string& name, std::int64_t c0,
                                                           std::int64_t c1) const {
  const TensorInfo& t = info(name);
  std::vector<float> v(
      t.shape.empty() ? 0 : std::size_t(t.shape[0]) * std::max<std::int64_t>(c1 - c0, 0));
  read_cols(name, c0, c1, SliceType::f32, v.data());
  return v;
}

// ---------------------------------------------------------------------------- writer
struct ShardedSafetensorsWriter::File {
  std::string path, tmp;
  std::ofstream out;
};

ShardedSafetensorsWriter::ShardedSafetensorsWriter(const std::string& dir,
                                                   std::vector<Tensor> tensors,
                                                   std::uint64_t max_shard_bytes)
    : dir_(dir), tensors_(std::move(tensors)) {
  MESHTRAIN_CHECK(!tensors_.empty(), "ShardedSafetensorsWriter: no tensors declared");
  MESHTRAIN_CHECK(max_shard_bytes > 0,
                  "ShardedSafetensorsWriter: max_shard_bytes must be positive");
  // save_pretrained's rule: a tensor opens a new shard when it would push the current one past
  // the limit (a tensor larger than the limit fills a shard alone).
  std::uint64_t in_shard = 0;
  std::size_t shard = 0;
  std::map<std::string, int> seen;
  for (const Tensor& t : tensors_) {
    MESHTRAIN_CHECK(element_size(t.dtype) == 4 || t.dtype == "BF16",
                    "ShardedSafetensorsWriter: tensor '", t.name, "' has dtype '", t.dtype,
                    "'; F32 or BF16 are written");
    MESHTRAIN_CHECK(seen.emplace(t.name, 1).second, "ShardedSafetensorsWriter: tensor '", t.name,
                    "' declared twice");
    std::uint64_t bytes = element_size(t.dtype);
    for (auto d : t.shape) bytes *= std::uint64_t(d);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      ++shard;
      in_shard = 0;
    }
    in_shard += bytes;
    shard_of_.push_back(shard);
  }
  const std::size_t n = shard + 1;
  for (std::size_t k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n);
    shard_files_.push_back((fs::path(dir) / (n == 1 ? "model.safetensors" : name)).string());
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError(cat("cannot create the folder '", dir, "': ", ec.message()));
}

ShardedSafetensorsWriter::~ShardedSafetensorsWriter() {
  if (finished_) return;
  // Abandoned (an error upstream): leave no partial files behind.
  file_.reset();
  for (const auto& f : shard_files_) std::remove((f + ".tmp").c_str());
}

void ShardedSafetensorsWriter::open_shard(std::size_t s) {
  // The header lists this shard's tensors with their offsets, known from the declaration.
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (shard_of_[i] != s) continue;
    const Tensor& t = tensors_[i];
    std::uint64_t bytes = element_size(t.dtype);
    for (auto d : t.shape) bytes *= std::uint64_t(d);
    h += cat(",", quoted(t.name), ":{\"dtype\":\"", t.dtype, "\",\"shape\":[");
    for (std::size_t k = 0; k < t.shape.size(); ++k) h += cat(k ? "," : "", t.shape[k]);
    h += cat("],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  file_ = std::make_unique<File>();
  file_->path = shard_files_[s];
  file_->tmp = file_->path + ".tmp";
  file_->out.open(file_->tmp, std::ios::binary | std::ios::trunc);
  if (!file_->out)
    throw ConfigError(
        cat("safetensors file '", file_->tmp, "' cannot be created: ", std::strerror(errno)));
  const std::uint64_t n = h.size();
  file_->out.write(reinterpret_cast<const char*>(&n), 8);
  file_->out.write(h.data(), static_cast<std::streamsize>(h.size()));
  open_ = s;
}

void ShardedSafetensorsWriter::append(const std::string& name, const float* values,
                                      std::size_t count) {
  MESHTRAIN_CHECK(!finished_ && next_ < tensors_.size(), "ShardedSafetensorsWriter: '", name,
                  "' appended after the last declared tensor");
  const Tensor& t = tensors_[next_];
  MESHTRAIN_CHECK(name == t.name, "ShardedSafetensorsWriter: got '", name,
                  "', the next declared tensor is '", t.name, "'");
  std::uint64_t numel = 1;
  for (auto d : t.shape) numel *= std::uint64_t(d);
  const std::size_t es = element_size(t.dtype);
  MESHTRAIN_CHECK(written_ / es + count <= numel, "ShardedSafetensorsWriter: tensor '", name,
                  "' has ", numel, " elements, ", written_ / es + count, " appended");
  if (open_ != shard_of_[next_]) open_shard(shard_of_[next_]);
  if (t.dtype == "F32") {
    file_->out.write(reinterpret_cast<const char*>(values),
                     static_cast<std::streamsize>(count * 4));
  } else {
    std::vector<std::uint16_t> b(count);
    for (std::size_t i = 0; i < count; ++i) b[i] = detail::float_to_bf16(values[i]);
    file_->out.write(reinterpret_cast<const char*>(b.data()),
                     static_cast<std::streamsize>(count * 2));
  }
  if (!file_->out)
    throw ConfigError(cat("safetensors file '", file_->tmp, "': write failed (disk full?)"));
  written_ += count * es;
  // A complete tensor moves on (a zero-element tensor is complete at once).
  while (next_ < tensors_.size()) {
    std::uint64_t n = 1;
    for (auto d : tensors_[next_].shape) n *= std::uint64_t(d);
    if (written_ < n * element_size(tensors_[next_].dtype)) break;
    ++next_;
    written_ = 0;
    if (next_ < tensors_.size() && shard_of_[next_] != open_) {
      file_->out.close();
      if (!file_->out) throw ConfigError(cat("safetensors file '", file_->tmp, "': write failed"));
      file_.reset();
      open_ = SIZE_MAX;
    }
  }
}

void ShardedSafetensorsWriter::finish() {
  // Zero-element tensors at the end complete without an append.
  if (next_ < tensors_.size() && written_ == 0) append(tensors_[next_].name, nullptr, 0);
  MESHTRAIN_CHECK(next_ == tensors_.size(), "ShardedSafetensorsWriter::finish: tensor '",
                  next_ < tensors_.size() ? tensors_[next_].name : "",
                  "' and the ones after it "
                  "were not appended completely");
  if (file_) {
    file_->out.close();
    if (!file_->out) throw ConfigError(cat("safetensors file '", file_->tmp, "': write failed"));
    file_.reset();
  }
  std::uint64_t total = 0;
  std::string map;
  std::vector<std::size_t> order(tensors_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](auto a, auto b) { return tensors_[a].name < tensors_[b].name; });
  for (std::size_t i : order) {
    std::uint64_t bytes = element_size(tensors_[i].dtype);
    for (auto d : tensors_[i].shape) bytes *= std::uint64_t(d);
    total += bytes;
    map += cat(map.empty() ? "" : ",\n", "    ", quoted(tensors_[i].name), ": ",
               quoted(fs::path(shard_files_[shard_of_[i]]).filename().string()));
  }
  for (const auto& f : shard_files_)
    if (std::rename((f + ".tmp").c_str(), f.c_str()) != 0)
      throw ConfigError(
          cat("safetensors file '", f, "': rename from .tmp failed: ", std::strerror(errno)));
  if (shard_files_.size() > 1) {
    const std::string index = (fs::path(dir_) / "model.safetensors.index.json").string();
    {
      std::ofstream out(index + ".tmp", std::ios::binary | std::ios::trunc);
      out << "{\n  \"metadata\": {\"total_size\": " << total << "},\n  \"weight_map\": {\n"
          << map << "\n  }\n}\n";
      out.close();
      if (!out) throw ConfigError(cat("'", index, ".tmp': write failed"));
    }
    if (std::rename((index + ".tmp").c_str(), index.c_str()) != 0)
      throw ConfigError(cat("'", index, "': rename from .tmp failed: ", std::strerror(errno)));
  }
  finished_ = true;
}

}  // namespace meshtrain::io
