#pragma once
// A stand-in for the model in tests of data parallelism: a parameter registry, full buffers
// where the ZeRO stage keeps them, and per-unit storage bound through bind_unit (an empty view
// keeps the binding, as GptT::bind_unit). Its "backward" writes gradients chosen by the test
// through whatever storage is bound, calling the hooks in GptT's order: embedding and blocks
// forward; the head's forward and backward (which also reads wte and writes its gradient); the
// blocks in reverse; the embedding's backward.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/mesh/mpi_comm.hpp"
#include "meshtrain/parallel/grad_sync.hpp"

namespace zt {

using namespace meshtrain;

inline model::GptConfig config(int n_layer, int n_embd, int vocab, int block) {
  model::GptConfig c;
  c.name = "zero-test";
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = n_embd;
  c.vocab_size = vocab;
  c.vocab_pad = 64;
  c.block_size = block;
  return c;
}

template <class T>
struct FakeModel {
  model::ParameterRegistry reg;
  std::vector<model::UnitInfo> units;
  View1<T> params, grads;
  std::vector<View1<T>> unit_params, unit_grads;
  int binds = 0;

  FakeModel(const model::GptConfig& cfg, int stage)
      : reg(cfg, 0, 1, 0, 0, cfg.n_layer, true, true), units(reg.units()) {
    if (stage <= 2) params = zeros<T>("test.params", reg.size());
    if (stage <= 1) grads = zeros<T>("test.grads", reg.size());
    unit_params.resize(units.size());
    unit_grads.resize(units.size());
    for (std::size_t u = 0; u < units.size(); ++u) {
      if (stage <= 2) unit_params[u] = slice(params, units[u].begin, units[u].size());
      if (stage <= 1) unit_grads[u] = slice(grads, units[u].begin, units[u].size());
    }
  }

  parallel::ModelBuffers<T> buffers() {
    parallel::ModelBuffers<T> b;
    b.registry = &reg;
    b.params = params;
    b.grads = grads;
    b.bind_unit = [this](int u, View1<T> p, View1<T> g) {
      if (p.span()) unit_params[u] = p;
      if (g.span()) unit_grads[u] = g;
      ++binds;
    };
    return b;
  }

  int n_units() const { return static_cast<int>(units.size()); }
  int wte_unit() const { return reg.embedding_unit(); }
  int head_unit() const { return reg.head_unit(); }

  // Adds value(flat index) to the gradient elements of unit u through the bound storage.
  void add_grads(int u, const std::function<float(std::size_t)>& value) {
    auto g = unit_grads[u];
    REQUIRE(g.span() == units[u].size());
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, g);
    for (const auto& p : reg.params()) {
      if (p.offset < units[u].begin || p.offset >= units[u].end) continue;
      for (std::size_t i = 0; i < p.numel; ++i) {
        const std::size_t f = p.offset + i;
        h(f - units[u].begin) += static_cast<T>(value(f));
      }
    }
    Kokkos::deep_copy(g, h);
  }

  // The parameters bound for unit u, as the model would read them.
  std::vector<float> read_params(int u) const {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, unit_params[u]);
    return std::vector<float>(h.data(), h.data() + h.span());
  }

  // Forward then backward of one micro-batch through the hooks. grad(flat) is this rank's
  // gradient; check_params(u, values) sees the parameters bound at each use.
  void micro_batch(parallel::GradSync<T>& s, const std::function<float(std::size_t)>& grad,
                   const std::function<void(int, const std::vector<float>&)>& check = {}) {
    const int head = head_unit(), eu = wte_unit();
    auto use = [&](int u) {
      if (check) check(u, read_params(u));
    };
    for (int u = 0; u < head; ++u) {  // the embedding, then the blocks
      s.before_forward(u);
      use(u);
    }
    s.before_forward(head);
    s.before_forward(eu);
    use(head);
    use(eu);
    // The head's backward runs inside its forward and writes half of wte's gradient.
    s.before_backward(head);
    s.before_backward(eu);
    use(head);
    use(eu);
    add_grads(head, grad);
    add_grads_of(eu, "transformer.wte.weight", grad, 0.5f);
    s.after_backward(head);
    for (int u = head - 1; u > eu; --u) {
      s.before_backward(u);
      use(u);
      add_grads(u, grad);
      s.after_backward(u);
    }
    s.before_backward(eu);
    use(eu);
    add_grads_of(eu, "transformer.wte.weight", grad, 0.5f);
    add_grads_of(eu, "transformer.wpe.weight", grad, 1.0f);
    s.after_backward(eu);
  }

  // Adds factor * value to one parameter's gradient through the bound storage of unit u.
  void add_grads_of(int u, const char* name, const std::function<float(std::size_t)>& value,
                    float factor) {
    const auto& p = reg.get(name);
    auto g = unit_grads[u];
    REQUIRE(g.span() == units[u].size());
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, g);
    for (std::size_t i = 0; i < p.numel; ++i) {
      const std::size_t f = p.offset + i;
      h(f - units[u].begin) += static_cast<T>(factor * value(f));
    }
    Kokkos::deep_copy(g, h);
  }
};

// Small integers (exact in fp32, sums included) that differ per element, rank and micro-batch.
inline float grad_value(int rank, int micro, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + 3 * rank + 5 * micro) % 17) - 8);
}
inline float param_value(std::size_t i) { return static_cast<float>(static_cast<int>(i % 29) - 14); }

// The whole world as the dp group (a duplicate the test owns).
struct WorldDp {
  mesh::MpiComm dup = mesh::MpiComm::duplicate(mt_test::world());
  std::unique_ptr<comm::Communicator> comm = comm::make_communicator(comm::default_backend(), dup.get());
};

// value(i) on the registry's parameter elements, 0 in the alignment gaps.
inline std::vector<float> on_params(const model::ParameterRegistry& reg,
                                    const std::function<float(std::size_t)>& value) {
  std::vector<float> v(reg.size(), 0.0f);
  for (const auto& p : reg.params())
    for (std::size_t i = 0; i < p.numel; ++i) v[p.offset + i] = value(p.offset + i);
  return v;
}

template <class T>
View1<T> to_device(const std::vector<float>& v) {
  View1<T> d = alloc<T>("test.vec", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = static_cast<T>(v[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

template <class V>
std::vector<float> to_host(const V& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, d);
  std::vector<float> v(h.span());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(h(i));
  return v;
}

// A corpus with structure to learn (a noisy recurrence x -> (mult x + noise) mod 60), one shard
// in <prefix>_<rank>/; returns its glob.
inline std::string recurrence_shard(const std::string& prefix, std::uint32_t seed,
                                    std::uint32_t first, std::uint32_t mult, std::uint32_t noise) {
  const std::string dir = prefix + "_" + std::to_string(mt_test::world_rank());
  std::filesystem::create_directories(dir);
  std::vector<std::uint16_t> t(40000);
  std::uint32_t s = seed, prev = first;
  for (auto& x : t) {
    s = s * 1664525u + 1013904223u;
    prev = (prev * mult + ((s >> 24) % noise)) % 60;
    x = static_cast<std::uint16_t>(prev);
  }
  meshtrain::io::write_shard(dir + "/data_000000.bin", t);
  return dir + "/data_*.bin";
}

}  // namespace zt
