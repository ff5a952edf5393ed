#include "meshtrain/core/alloc_tracker.hpp"

#include <unordered_map>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/kokkos_compat.hpp"

namespace meshtrain {

namespace {

struct State {
  bool installed = false;
  std::vector<std::string> ignore;
  std::unordered_map<const void*, std::pair<std::string, std::size_t>> blocks;
  std::size_t live = 0, peak = 0;
};
State& state() {
  static State s;
  return s;
}

std::string strip(const char* label) {
  std::string s = label ? label : "";
  const std::string pre = "meshtrain::";
  if (s.compare(0, pre.size(), pre) == 0) s.erase(0, pre.size());
  return s;
}

void on_allocate(Kokkos_Profiling_SpaceHandle, const char* label, const void* ptr,
                 std::uint64_t size) {
  State& s = state();
  std::string name = strip(label);
  for (const auto& p : s.ignore)
    if (name.compare(0, p.size(), p) == 0) return;
  s.blocks[ptr] = {std::move(name), static_cast<std::size_t>(size)};
  s.live += size;
  if (s.live > s.peak) s.peak = s.live;
}

void on_deallocate(Kokkos_Profiling_SpaceHandle, const char*, const void* ptr, std::uint64_t) {
  State& s = state();
  auto it = s.blocks.find(ptr);
  if (it == s.blocks.end()) return;
  s.live -= it->second.second;
  s.blocks.erase(it);
}

}  // namespace

AllocTracker::AllocTracker(std::vector<std::string> ignore_prefixes) {
  State& s = state();
  MESHTRAIN_CHECK(!s.installed, "AllocTracker: only one tracker at a time");
  s = State{};
  s.installed = true;
  s.ignore = std::move(ignore_prefixes);
  namespace E = Kokkos::Tools::Experimental;
  E::set_allocate_data_callback(on_allocate);
  E::set_deallocate_data_callback(on_deallocate);
}

AllocTracker::~AllocTracker() {
  namespace E = Kokkos::Tools::Experimental;
  E::set_allocate_data_callback(nullptr);
  E::set_deallocate_data_callback(nullptr);
  state() = State{};
}

std::size_t AllocTracker::live() const { return state().live; }
std::size_t AllocTracker::peak() const { return state().peak; }
void AllocTracker::reset_peak() { state().peak = state().live; }

std::map<std::string, std::size_t> AllocTracker::live_by_label() const {
  std::map<std::string, std::size_t> out;
  for (const auto& [ptr, b] : state().blocks) out[b.first] += b.second;
  return out;
}

}  // namespace meshtrain
