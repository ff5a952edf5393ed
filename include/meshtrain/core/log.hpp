#pragma once
// Logging: rank 0 by default; every rank with a "[rank r dp/pp/tp]" prefix when asked
// (--log.all_ranks). Messages go to stdout (info) or stderr (warn, error), one line per call so
// lines of different ranks do not interleave mid-line.
#include <string>

#include "meshtrain/core/error.hpp"

namespace meshtrain::logging {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

struct Context {
  int world_rank = 0;
  std::string coords;     // "dp/pp/tp" of this rank, empty before the mesh exists
  bool all_ranks = false;  // print on every rank, prefixed
  Level level = Level::info;
};

void set_context(const Context& ctx);
const Context& context();
Level parse_level(const std::string& s);  // throws ConfigError naming log.level

void write(Level level, const std::string& msg, bool every_rank = false);

template <class... A> void debug(A&&... a) { write(Level::debug, cat(std::forward<A>(a)...)); }
template <class... A> void info(A&&... a) { write(Level::info, cat(std::forward<A>(a)...)); }
template <class... A> void warn(A&&... a) { write(Level::warn, cat(std::forward<A>(a)...)); }
template <class... A> void error(A&&... a) { write(Level::error, cat(std::forward<A>(a)...)); }
// Printed by every rank regardless of log.all_ranks (per-rank diagnostics).
template <class... A> void each(A&&... a) { write(Level::info, cat(std::forward<A>(a)...), true); }

}  // namespace meshtrain::logging
