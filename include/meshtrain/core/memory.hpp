#pragma once
#include <cstddef>

namespace meshtrain {
// Peak resident memory of this process on the host (bytes), from getrusage.
std::size_t host_peak_rss_bytes();
// Device memory in use on this rank's GPU (bytes; 0 in host-only builds).
std::size_t device_used_bytes();
}  // namespace meshtrain
