#pragma once
// Helpers shared by the io tests: capture an error's message, temporary file names per rank.
#include <fstream>
#include <string>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"

namespace io_test {

// The message of the ConfigError that f throws, or "<no error>".
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const meshtrain::ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

inline bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A file name in the working directory that no other rank or test uses.
inline std::string temp_name(const std::string& stem, const std::string& ext) {
  return "io_" + stem + "_r" + std::to_string(mt_test::world_rank()) + ext;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace io_test
