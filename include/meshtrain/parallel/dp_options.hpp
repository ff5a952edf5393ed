#pragma once
// Options of data parallelism and ZeRO (zero.*, dp.* in the configuration). Kept apart from the
// classes that use them so that the configuration of a layout needs neither the model nor the
// optimizer.
#include <cstddef>

namespace meshtrain::parallel {

struct DpOptions {
  int zero_stage = 0;                        // 0: DDP; 1: + optimizer state; 2: + grads; 3: + params
  std::size_t bucket_bytes = 25u << 20;      // gradient bucket size (bytes of the compute type)
  bool overlap = true;                       // false: wait for each collective when launched
  bool offload = false;                      // optimizer state and step on the host
  int offload_threads = 0;                   // threads of the host step (0: automatic)
  // Zero the whole gradient buffer at the begin of every step, as before first-write gradients
  // (model/grad_first_write.hpp): the same numbers, ~1.3 ms more memset per step at the
  // Llama-8B shape. For A/B checks and tests.
  bool zero_grads_always = false;
};

}  // namespace meshtrain::parallel
