#include "meshtrain/core/log.hpp"

#include <cstdio>
#include <string>

namespace meshtrain::logging {

namespace {
Context g_ctx;
}

void set_context(const Context& ctx) { g_ctx = ctx; }
const Context& context() { return g_ctx; }

Level parse_level(const std::string& s) {
  if (s == "debug") return Level::debug;
  if (s == "info") return Level::info;
  if (s == "warn") return Level::warn;
  if (s == "error") return Level::error;
  throw ConfigError(cat("log.level='", s, "' is not one of debug, info, warn, error"));
}

void write(Level level, const std::string& msg, bool every_rank) {
  if (level < g_ctx.level) return;
  const bool show = every_rank || g_ctx.all_ranks || g_ctx.world_rank == 0 || level == Level::error;
  if (!show) return;
  std::string line;
  if (g_ctx.all_ranks || every_rank || (level == Level::error && g_ctx.world_rank != 0)) {
    line = cat("[rank ", g_ctx.world_rank, g_ctx.coords.empty() ? "" : " ", g_ctx.coords, "] ");
  }
  if (level == Level::warn) line += "warning: ";
  if (level == Level::error) line += "error: ";
  line += msg;
  line += '\n';
  FILE* out = level >= Level::warn ? stderr : stdout;
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
}

}  // namespace meshtrain::logging
