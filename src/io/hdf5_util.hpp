#pragma once
// Small RAII and error helpers over the HDF5 C API (private to src/io). Every HDF5 call goes
// through MESHTRAIN_H5_CHECK, whose error carries the call text, HDF5's own error stack (which
// says e.g. "truncated file: eof = ..."), file:line and the rank. HDF5's automatic printing of
// error stacks is switched off while checkpoint code runs (H5Silence) so the stack appears once,
// in our message.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io::h5 {

// HDF5's error stack of this thread as one line (innermost messages last); clears it.
std::string error_stack();
[[noreturn]] void fail(const char* call, const char* file, int line);

// Switches HDF5's automatic error printing off for its lifetime.
class Silence {
 public:
  Silence();
  ~Silence();
  Silence(const Silence&) = delete;
  Silence& operator=(const Silence&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

void note_released();  // counts released handles (io::abandoned_hdf5_files)

// An owned hid_t with its close function.
class Handle {
 public:
  using Close = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Close close) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now, reporting failure (a file close is where buffered data is written).
  void close(const char* what);
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  // Forgets the id without closing it: after an error on this rank alone, closing a parallel
  // file (a collective call) would wait for ranks that are elsewhere; the job is aborted anyway.
  void release() {
    if (id_ >= 0) note_released();
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Close close_ = nullptr;
};

// Attributes (scalar). Strings are fixed-length UTF-8, which h5ls, h5dump and h5py all show.
void write_attr(hid_t obj, const char* name, const std::string& value);
void write_attr(hid_t obj, const char* name, std::int64_t value);
void write_attr(hid_t obj, const char* name, std::uint64_t value);
void write_attr(hid_t obj, const char* name, double value);
bool has_attr(hid_t obj, const char* name);
// Each throws ConfigError naming `where` and the attribute when it is missing or of another kind.
std::string read_attr_string(hid_t obj, const char* name, const std::string& where);
std::int64_t read_attr_i64(hid_t obj, const char* name, const std::string& where);
std::uint64_t read_attr_u64(hid_t obj, const char* name, const std::string& where);
double read_attr_f64(hid_t obj, const char* name, const std::string& where);

}  // namespace meshtrain::io::h5

// Evaluates an HDF5 call; a negative result throws meshtrain::Error with HDF5's error stack.
#define MESHTRAIN_H5_CHECK(call)                                                       \
  ([&]() {                                                                             \
    auto mt_h5_rc_ = (call);                                                           \
    if (mt_h5_rc_ < 0) ::meshtrain::io::h5::fail(#call, __FILE__, __LINE__);           \
    return mt_h5_rc_;                                                                  \
  }())
