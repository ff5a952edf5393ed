#include "meshtrain/parallel/model_transfer.hpp"

#include <vector>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/mesh/rank_math.hpp"
#include "meshtrain/parallel/ownership.hpp"

namespace meshtrain::parallel {

namespace {
template <bool kToLocal>
void copy_between(const model::ParameterRegistry& global, const model::ParameterRegistry& local,
                  float* gbuf, float* lbuf) {
  for (const auto& p : local.params()) {
    const auto& g = global.get(p.name);
    for (std::size_t i = 0; i < p.numel; ++i) {
      const auto gi = static_cast<std::size_t>(
          p.global_index(static_cast<std::int64_t>(i), local.tp_rank(), local.tp_size()));
      if constexpr (kToLocal) lbuf[p.offset + i] = gbuf[g.offset + gi];
      else gbuf[g.offset + gi] = lbuf[p.offset + i];
    }
  }
}

model::ParameterRegistry whole_registry(const model::GptConfig& cfg) {
  return model::ParameterRegistry(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
}

template <class T>
std::vector<float> to_host_float(View1<const T> v, std::size_t n) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(h(i));
  return out;
}
}  // namespace

void copy_global_to_local(const model::ParameterRegistry& global, const float* global_buf,
                          const model::ParameterRegistry& local, float* local_buf) {
  copy_between<true>(global, local, const_cast<float*>(global_buf), local_buf);
}

void copy_local_to_global(const model::ParameterRegistry& local, const float* local_buf,
                          const model::ParameterRegistry& global, float* global_buf) {
  copy_between<false>(global, local, global_buf, const_cast<float*>(local_buf));
}

template <class T>
std::unique_ptr<model::Gpt> gather_to_rank0(const ParallelContext& par, const model::GptT<T>& m,
                                            View1<const T> params) {
  const auto& mesh = par.mesh();
  const MPI_Comm world = mesh.world().get();
  const int me = mesh.rank();
  // Who contributes what to the one copy (parallel::first_copy): the first of each slice's
  // replicas its dense parameters, the first of each ep rank's expert replicas its experts.
  // The senders send their whole slice; rank 0 takes their owned pieces out of it.
  const mesh::Shape& shape = mesh.shape();
  const int ep = shape.ep;
  auto replicas = [&](int r, std::vector<std::string> names) {
    const mesh::Group g = mesh::group_of(r, names, shape, mesh.order());
    return Replicas{g.key, static_cast<int>(g.members.size())};
  };
  auto own_of = [&](int r, std::size_t n) {
    return first_copy(n, replicas(r, {"dp", "cp"}), ep,
                      ep > 1 ? replicas(r, {"edp", "cp"}) : Replicas{});
  };
  auto sends = [](const Ownership& o) { return !o.dense.empty() || !o.expert.empty(); };
  if (me != 0) {
    if (sends(own_of(me, m.registry().size()))) {
      auto h = to_host_float<T>(params, m.registry().size());
      MESHTRAIN_MPI_CHECK(MPI_Send(h.data(), static_cast<int>(h.size()), MPI_FLOAT, 0, 77, world));
    }
    return nullptr;
  }
  const model::GptConfig& cfg = m.config();
  auto full = std::make_unique<model::Gpt>(cfg, 1, m.seq_len());
  const auto greg = whole_registry(cfg);
  std::vector<float> gbuf(greg.size(), 0.0f);
  for (int r = 0; r < mesh.size(); ++r) {
    const mesh::Coord c = mesh::coord_of(r, shape, mesh.order());
    const auto& spec = par.schedule();
    const model::ParameterRegistry reg(cfg, c.tp, shape.tp, c.pp,
                                       stage_chunks(par.pieces(), spec.pp, c.pp), c.pp == 0,
                                       c.pp == spec.pp - 1, c.dp % ep, ep);
    const Ownership own = own_of(r, reg.size());
    if (!sends(own)) continue;
    std::vector<float> buf;
    if (r == 0) {
      buf = to_host_float<T>(params, reg.size());
    } else {
      buf.resize(reg.size());
      MESHTRAIN_MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, r, 77,
                                   world, MPI_STATUS_IGNORE));
    }
    for (const OwnedPiece& o : owned_pieces(reg, own, false)) {
      const model::ParamInfo& p = *o.piece.param;
      const std::size_t at = greg.get(p.name).offset;
      for (std::size_t i = o.piece.local_begin; i < o.piece.local_begin + o.piece.count; ++i)
        gbuf[at + static_cast<std::size_t>(p.global_index(static_cast<std::int64_t>(i),
                                                           reg.tp_rank(), reg.tp_size()))] =
            buf[p.offset + i];
    }
  }
  auto h = Kokkos::create_mirror_view(full->params());
  for (std::size_t i = 0; i < gbuf.size(); ++i) h(i) = gbuf[i];
  Kokkos::deep_copy(full->params(), h);
  return full;
}

template <class T>
void take_slice(const model::Gpt& full, const model::GptT<T>& m, View1<T> params) {
  const auto greg = whole_registry(m.config());
  auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, full.params());
  std::vector<float> local(m.registry().size(), 0.0f);
  copy_global_to_local(greg, g.data(), m.registry(), local.data());
  auto h = Kokkos::create_mirror_view(params);
  for (std::size_t i = 0; i < local.size(); ++i) h(i) = static_cast<T>(local[i]);
  Kokkos::deep_copy(params, h);
}

template std::unique_ptr<model::Gpt> gather_to_rank0<float>(const ParallelContext&,
                                                            const model::GptT<float>&,
                                                            View1<const float>);
template void take_slice<float>(const model::Gpt&, const model::GptT<float>&, View1<float>);
#if MESHTRAIN_HAVE_BF16
template std::unique_ptr<model::Gpt> gather_to_rank0<bf16>(const ParallelContext&,
                                                           const model::GptT<bf16>&,
                                                           View1<const bf16>);
template void take_slice<bf16>(const model::Gpt&, const model::GptT<bf16>&, View1<bf16>);
template std::unique_ptr<model::Gpt> gather_to_rank0<fp16>(const ParallelContext&,
                                                           const model::GptT<fp16>&,
                                                           View1<const fp16>);
template void take_slice<fp16>(const model::Gpt&, const model::GptT<fp16>&, View1<fp16>);
#endif

}  // namespace meshtrain::parallel
