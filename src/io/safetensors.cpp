// safetensors reader and writer, following the reference implementation
// (huggingface/safetensors, safetensors/src/tensor.rs): the header is at most 100 MB, tensors
// tile the data section exactly (no gaps, no overlap), each tensor's byte count is its shape times
// its dtype's size; the writer pads the header with spaces to a multiple of 8 bytes so the data
// section is aligned for any dtype.
#include "meshtrain/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "meshtrain/core/error.hpp"
#include "float16.hpp"
#include "meshtrain/core/json.hpp"

namespace meshtrain::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

constexpr std::uint64_t kMaxHeader = 100'000'000;

// Bytes per element of every dtype the format defines; 0 for an unknown one.
int dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

using detail::half_to_float;

std::string where(const std::string& path) { return cat("safetensors file '", path, "'"); }

}  // namespace

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const std::string w = where(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(cat(w, " cannot be opened: ", std::strerror(errno)));
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw ConfigError(cat(w, ": cannot read its size: ", ec.message()));
  if (size < 8) throw ConfigError(cat(w, " is ", size, " bytes, shorter than the 8-byte header length"));
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > kMaxHeader || n > size - 8)
    throw ConfigError(cat(w, ": header length ", n, " (bytes 0-7) exceeds ",
                          n > kMaxHeader ? cat("the 100 MB limit") : cat("the file size ", size),
                          ": not a safetensors file, or truncated"));
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n)))
    throw ConfigError(cat(w, ": cannot read the ", n, "-byte header"));
  data_start_ = 8 + n;
  const std::uint64_t data_size = size - data_start_;
  const Json j = json::parse(header, cat(w, " header (starting at file byte 8)"));
  if (!j.is_object()) throw ConfigError(cat(w, ": the header is not a JSON object"));

  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw ConfigError(cat(w, ": __metadata__ is not an object of strings"));
      for (const auto& [k, s] : v.items())
        metadata_[k] = json::as_string(s, cat(w, ": __metadata__ '", k, "'"));
      continue;
    }
    const std::string t = cat(w, ": tensor '", name, "'");
    TensorInfo info;
    info.dtype = json::as_string(json::at(v, "dtype", t), cat(t, " dtype"));
    if (dtype_size(info.dtype) == 0) throw ConfigError(cat(t, ": unknown dtype '", info.dtype, "'"));
    const Json& shape = json::at(v, "shape", t);
    if (!shape.is_array()) throw ConfigError(cat(t, ": shape is not an array"));
    for (const Json& d : shape) {
      const std::int64_t x = json::as_int(d, cat(t, " shape"));
      if (x < 0) throw ConfigError(cat(t, ": negative dimension ", x, " in its shape"));
      info.shape.push_back(x);
    }
    const Json& off = json::at(v, "data_offsets", t);
    if (!off.is_array() || off.size() != 2)
      throw ConfigError(cat(t, ": data_offsets must be [begin, end]"));
    const std::int64_t b = json::as_int(off[0], cat(t, " data_offsets")),
                       e = json::as_int(off[1], cat(t, " data_offsets"));
    if (b < 0 || e < b)
      throw ConfigError(cat(t, ": data_offsets [", b, ", ", e, "] are not an interval"));
    info.begin = static_cast<std::uint64_t>(b);
    info.end = static_cast<std::uint64_t>(e);
    const std::uint64_t expect =
        static_cast<std::uint64_t>(info.numel()) * static_cast<std::uint64_t>(dtype_size(info.dtype));
    if (info.end - info.begin != expect)
      throw ConfigError(cat(t, ": data_offsets [", b, ", ", e, "] span ", e - b,
                            " bytes but ", info.dtype, " of shape with ", info.numel(),
                            " elements needs ", expect));
    if (info.end > data_size)
      throw ConfigError(cat(t, ": data_offsets [", b, ", ", e, "] run past the end of the ",
                            data_size, "-byte data section (file truncated?)"));
    if (!tensors_.emplace(name, std::move(info)).second)
      throw ConfigError(cat(t, " appears twice in the header"));
  }
  // The reference rejects gaps and overlaps: tensors must tile the data section exactly.
  std::vector<const std::pair<const std::string, TensorInfo>*> by_offset;
  for (const auto& kv : tensors_) by_offset.push_back(&kv);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->second.begin < b->second.begin; });
  std::uint64_t pos = 0;
  for (const auto* kv : by_offset) {
    if (kv->second.begin != pos)
      throw ConfigError(cat(w, ": tensor '", kv->first, "' starts at data byte ", kv->second.begin,
                            ", expected ", pos, " (tensors overlap or leave a gap)"));
    pos = kv->second.end;
  }
  if (pos != data_size)
    throw ConfigError(cat(w, ": the tensors cover ", pos, " bytes of the ", data_size,
                          "-byte data section"));
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw ConfigError(cat(where(path_), " has no tensor '", name, "'"));
  return it->second;
}

namespace {

std::vector<char> read_bytes(const std::string& path, std::uint64_t at, std::uint64_t n) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(n);
  if (!in || !in.seekg(static_cast<std::streamoff>(at)) ||
      !in.read(buf.data(), static_cast<std::streamsize>(n)))
    throw ConfigError(cat(where(path), ": cannot read ", n, " bytes at byte ", at));
  return buf;
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::vector<float> SafetensorsReader::read_f32(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto n = static_cast<std::size_t>(t.numel());
  const auto raw = read_bytes(path_, data_start_ + t.begin, t.end - t.begin);
  std::vector<float> out(n);
  const char* p = raw.data();
  if (t.dtype == "F32") {
    std::memcpy(out.data(), p, n * 4);
  } else if (t.dtype == "F16") {
    for (std::size_t i = 0; i < n; ++i) out[i] = half_to_float(load<std::uint16_t>(p + 2 * i));
  } else if (t.dtype == "BF16") {
    // bfloat16 is the top half of a float32.
    for (std::size_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load<std::uint16_t>(p + 2 * i)) << 16);
  } else if (t.dtype == "F64") {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load<double>(p + 8 * i));
  } else {
    throw ConfigError(cat(where(path_), ": tensor '", name, "' has dtype ", t.dtype,
                          "; expected F32, F16, BF16 or F64"));
  }
  return out;
}

std::vector<std::int32_t> SafetensorsReader::read_i32(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto n = static_cast<std::size_t>(t.numel());
  const auto raw = read_bytes(path_, data_start_ + t.begin, t.end - t.begin);
  std::vector<std::int32_t> out(n);
  if (t.dtype == "I32") {
    std::memcpy(out.data(), raw.data(), n * 4);
  } else if (t.dtype == "I64") {
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = load<std::int64_t>(raw.data() + 8 * i);
      if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
        throw ConfigError(cat(where(path_), ": tensor '", name, "' element ", i, " = ", v,
                              " does not fit int32"));
      out[i] = static_cast<std::int32_t>(v);
    }
  } else {
    throw ConfigError(cat(where(path_), ": tensor '", name, "' has dtype ", t.dtype,
                          "; expected I32 or I64"));
  }
  return out;
}

namespace {

template <class T>
std::vector<char> as_bytes(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void check_entry(const std::string& name, const std::vector<std::int64_t>& shape, std::size_t n,
                 bool taken) {
  std::int64_t numel = 1;
  for (auto d : shape) {
    MESHTRAIN_CHECK(d >= 0, "safetensors: tensor '", name, "' has a negative dimension");
    numel *= d;
  }
  MESHTRAIN_CHECK(static_cast<std::size_t>(numel) == n, "safetensors: tensor '", name, "' has ",
                  n, " values but its shape holds ", numel);
  MESHTRAIN_CHECK(name != "__metadata__" && !name.empty(), "safetensors: bad tensor name '", name, "'");
  MESHTRAIN_CHECK(!taken, "safetensors: tensor '", name, "' added twice");
}

}  // namespace

void SafetensorsWriter::add_f32(const std::string& name, std::vector<std::int64_t> shape,
                                std::vector<float> data) {
  check_entry(name, shape, data.size(), entries_.count(name) > 0);
  entries_[name] = Entry{"F32", std::move(shape), as_bytes(data)};
}

void SafetensorsWriter::add_i32(const std::string& name, std::vector<std::int64_t> shape,
                                std::vector<std::int32_t> data) {
  check_entry(name, shape, data.size(), entries_.count(name) > 0);
  entries_[name] = Entry{"I32", std::move(shape), as_bytes(data)};
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  // Header keys and data both in name order (std::map), __metadata__ first as the reference
  // does; compact, as the reference writes it.
  Json header = Json::object();
  if (!metadata_.empty()) {
    Json& meta = header["__metadata__"] = Json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
  }
  std::uint64_t offset = 0;
  for (const auto& [name, e] : entries_) {
    header[name] = {{"dtype", e.dtype}, {"shape", e.shape},
                    {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h;
  try {
    h = header.dump();
  } catch (const Json::exception& e) {  // a name or metadata string that is not UTF-8
    throw Error(cat(where(path), ": cannot write the header: ", e.what()));
  }
  h.append((8 - h.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ConfigError(cat(where(tmp), " cannot be created: ", std::strerror(errno)));
    const std::uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, e] : entries_)
      out.write(e.bytes.data(), static_cast<std::streamsize>(e.bytes.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw ConfigError(cat(where(tmp), ": write failed (disk full?)"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw ConfigError(cat(where(path), ": rename from ", tmp, " failed: ", std::strerror(err)));
  }
}

}  // namespace meshtrain::io
