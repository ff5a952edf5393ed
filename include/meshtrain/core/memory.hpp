#pragma once
#include <cstddef>

namespace meshtrain {
// Peak resident memory of this process on the host (bytes), from getrusage.
std::size_t host_peak_rss_bytes();
// Device memory in use on this rank's GPU (bytes; 0 in host-only builds).
std::size_t device_used_bytes();
// What the memory figures are out of: the GPU's memory, or the host's physical memory in
// host-only builds (shared by the node's ranks).
std::size_t device_capacity_bytes();
// Free memory of this rank's GPU now (cudaMemGetInfo; 0 in host-only builds).
std::size_t device_free_bytes();
// The node's MemAvailable (/proc/meminfo: what can be allocated without swapping, page cache
// included), in bytes; 0 when it cannot be read.
std::size_t host_available_bytes();
}  // namespace meshtrain
