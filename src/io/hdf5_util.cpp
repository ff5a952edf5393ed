#include "hdf5_util.hpp"

#include <atomic>
#include <vector>

#include "meshtrain/io/checkpoint.hpp"

namespace meshtrain::io {

namespace {
std::atomic<int> g_released{0};
}

bool abandoned_hdf5_files() { return g_released.load() > 0; }

}  // namespace meshtrain::io

namespace meshtrain::io::h5 {

void note_released() { ++g_released; }

namespace {

herr_t collect(unsigned /*n*/, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (e->desc && *e->desc) out->push_back(cat(e->func_name ? e->func_name : "?", ": ", e->desc));
  return 0;
}

}  // namespace

std::string error_stack() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &msgs);
  H5Eclear2(H5E_DEFAULT);
  // The outermost entries repeat the API call; the innermost say what went wrong.
  std::string s;
  const std::size_t first = msgs.size() > 4 ? msgs.size() - 4 : 0;
  for (std::size_t i = first; i < msgs.size(); ++i) s += (s.empty() ? "" : "; ") + msgs[i];
  return s.empty() ? "no HDF5 error message" : s;
}

void fail(const char* call, const char* file, int line) {
  throw_call_error("HDF5", call, error_stack(), file, line);
}

Silence::Silence() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Silence::~Silence() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

void Handle::close(const char* what) {
  if (id_ < 0) return;
  const herr_t rc = close_(id_);
  id_ = -1;
  if (rc < 0) throw Error(cat("HDF5: closing ", what, " failed: ", error_stack()));
}

namespace {

Handle scalar_space() { return Handle(MESHTRAIN_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose); }

void write_numeric(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                   const void* value) {
  Handle space = scalar_space();
  Handle a(MESHTRAIN_H5_CHECK(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT)),
           H5Aclose);
  MESHTRAIN_H5_CHECK(H5Awrite(a, mem_type, value));
}

Handle open_attr(hid_t obj, const char* name, const std::string& where) {
  if (!has_attr(obj, name))
    throw ConfigError(cat(where, " has no attribute '", name, "' (not a meshtrain checkpoint, or "
                          "written by an incompatible version)"));
  return Handle(MESHTRAIN_H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
}

// Reads a numeric scalar attribute converted to `mem_type`, checking its class.
void read_numeric(hid_t obj, const char* name, const std::string& where, H5T_class_t cls,
                  hid_t mem_type, void* out) {
  Handle a = open_attr(obj, name, where);
  Handle t(MESHTRAIN_H5_CHECK(H5Aget_type(a)), H5Tclose);
  if (H5Tget_class(t) != cls)
    throw ConfigError(cat(where, ": attribute '", name, "' has an unexpected type"));
  MESHTRAIN_H5_CHECK(H5Aread(a, mem_type, out));
}

}  // namespace

void write_attr(hid_t obj, const char* name, const std::string& value) {
  Handle type(MESHTRAIN_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  MESHTRAIN_H5_CHECK(H5Tset_size(type, value.empty() ? 1 : value.size()));
  MESHTRAIN_H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLPAD));
  MESHTRAIN_H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  const std::string buf = value.empty() ? std::string(1, '\0') : value;
  write_numeric(obj, name, type, type, buf.data());
}

void write_attr(hid_t obj, const char* name, std::int64_t value) {
  write_numeric(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_attr(hid_t obj, const char* name, std::uint64_t value) {
  write_numeric(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

void write_attr(hid_t obj, const char* name, double value) {
  write_numeric(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

bool has_attr(hid_t obj, const char* name) { return MESHTRAIN_H5_CHECK(H5Aexists(obj, name)) > 0; }

std::string read_attr_string(hid_t obj, const char* name, const std::string& where) {
  Handle a = open_attr(obj, name, where);
  Handle t(MESHTRAIN_H5_CHECK(H5Aget_type(a)), H5Tclose);
  if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0)
    throw ConfigError(cat(where, ": attribute '", name, "' is not a fixed-length string"));
  const std::size_t n = H5Tget_size(t);
  std::string s(n, '\0');
  MESHTRAIN_H5_CHECK(H5Aread(a, t, s.data()));
  s.resize(s.find('\0') == std::string::npos ? n : s.find('\0'));
  return s;
}

std::int64_t read_attr_i64(hid_t obj, const char* name, const std::string& where) {
  std::int64_t v = 0;
  read_numeric(obj, name, where, H5T_INTEGER, H5T_NATIVE_INT64, &v);
  return v;
}

std::uint64_t read_attr_u64(hid_t obj, const char* name, const std::string& where) {
  std::uint64_t v = 0;
  read_numeric(obj, name, where, H5T_INTEGER, H5T_NATIVE_UINT64, &v);
  return v;
}

double read_attr_f64(hid_t obj, const char* name, const std::string& where) {
  double v = 0;
  read_numeric(obj, name, where, H5T_FLOAT, H5T_NATIVE_DOUBLE, &v);
  return v;
}

}  // namespace meshtrain::io::h5
