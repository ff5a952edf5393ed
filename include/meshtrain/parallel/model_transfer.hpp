#pragma once
// Moving whole-model parameters in and out of a parallel layout: world rank 0 gathers every
// rank's slice into a single-rank model (HuggingFace export, sampling after training), and every
// rank takes its slice of a single-rank model (starting from a HuggingFace checkpoint). Elements
// are placed through the registries' global indices, so any (dp, pp, tp) works.
#include <memory>

#include "meshtrain/model/gpt.hpp"
#include "meshtrain/parallel/context.hpp"

namespace meshtrain::parallel {

// local[i] = global[global index of local element i] for every parameter of `local` (host
// buffers laid out by the two registries; `global` is a tp = 1 registry of every layer).
void copy_global_to_local(const model::ParameterRegistry& global, const float* global_buf,
                          const model::ParameterRegistry& local, float* local_buf);
void copy_local_to_global(const model::ParameterRegistry& local, const float* local_buf,
                          const model::ParameterRegistry& global, float* global_buf);

// Collective over the world. `params`: this rank's full flat parameter buffer (the model's, or
// ZeRO-3's gathered copy). World rank 0 returns a single-rank fp32 model (batch 1, the model's
// seq_len) holding the global parameters; the other ranks return null.
template <class T>
std::unique_ptr<model::Gpt> gather_to_rank0(const ParallelContext& par, const model::GptT<T>& m,
                                            View1<const T> params);

// This rank's slice of `full` (the same on every rank) into `params` (m's registry layout).
template <class T>
void take_slice(const model::Gpt& full, const model::GptT<T>& m, View1<T> params);

}  // namespace meshtrain::parallel
