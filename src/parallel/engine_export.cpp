// The engine's HuggingFace export, streamed tensor by tensor to world rank 0.
//
// Who sends what is the checkpoint's rule (parallel::ownership, ownership.hpp): each rank's
// owned pieces of its (tp, pp) slice, deduplicated, so the pieces of the world cover every
// element of every tensor exactly once. For each tensor of the whole model,
// in the folder's order, every rank tells rank 0 how many pieces it holds (one MPI_Gather of an
// int), sends each as a header (its rectangles in the global tensor) and its values; rank 0
// assembles that one tensor in a host buffer and appends it to the writer. So rank 0 holds one
// tensor (plus the staging of one piece whose rectangles are not one run of the tensor), a
// sender one piece: a 70B export needs the largest tensor of host memory, not the model.
//
// Failures: a sender that cannot stage a piece sends a header flagged failed (and no values);
// rank 0 keeps receiving what the others send for the tensor, then broadcasts the stop before
// the next one; at the end the first error is agreed over the world.
#include <algorithm>
#include <exception>
#include <map>
#include <type_traits>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/parallel/grad_sync.hpp"
#include "meshtrain/parallel/zero_optimizer.hpp"

namespace meshtrain::parallel {

namespace {

constexpr int kHeaderTag = 91, kDataTag = 92;
// MPI counts are ints: values move in chunks of at most 2^28 floats (1 GiB).
constexpr std::size_t kChunk = std::size_t(1) << 28;

// Host buffers of the export, counted (HfExportStats) and visible to the AllocTracker.
struct Meter {
  io::HfExportStats& s;
  std::size_t live = 0;
  HostView1<float> take(const char* label, std::size_t n) {
    const std::size_t b = n * sizeof(float);
    s.largest_buffer_bytes = std::max(s.largest_buffer_bytes, b);
    live += b;
    s.peak_buffer_bytes = std::max(s.peak_buffer_bytes, live);
    return HostView1<float>(std::string(label), n);
  }
  void give(HostView1<float>& v) {
    live -= v.span() * sizeof(float);
    v = HostView1<float>();
  }
};

// A piece this rank sends and where its values are in `src` (consecutive elements).
struct Source {
  io::TensorPiece piece;
  std::size_t at = 0;
};

// The piece's rectangles as the header: [status, n, then row0 col0 rows cols per block].
std::vector<std::int64_t> header_of(const io::TensorPiece& pc, bool failed) {
  std::vector<std::int64_t> h{failed ? 1 : 0, 0};
  if (failed) return h;
  for (const io::Block& b : io::global_blocks(pc)) {
    h.insert(h.end(), {b.row0, b.col0, b.rows, b.cols});
    ++h[1];
  }
  return h;
}

// Columns of the tensor seen as a matrix (a 1-D tensor is one row).
std::int64_t global_cols(const model::ParamInfo& p) {
  return p.global_shape.size() == 2 ? p.global_shape[1] : p.global_shape[0];
}

// The blocks' elements in the order a piece lists its values: blocks of one (row0, rows) form a
// local rectangle; its rows in order, each row's blocks in order (io::global_blocks).
template <class F>
void for_each_run(const std::vector<std::int64_t>& h, std::int64_t gcols, F&& f) {
  const std::int64_t n = h[1];
  std::size_t at = 0;
  for (std::int64_t b = 0; b < n;) {
    std::int64_t e = b + 1;
    const std::int64_t* B = &h[2 + 4 * b];
    while (e < n && h[2 + 4 * e] == B[0] && h[2 + 4 * e + 2] == B[2]) ++e;
    for (std::int64_t r = B[0]; r < B[0] + B[2]; ++r)
      for (std::int64_t k = b; k < e; ++k) {
        const std::int64_t* K = &h[2 + 4 * k];
        f(static_cast<std::size_t>(r * gcols + K[1]), at, static_cast<std::size_t>(K[3]));
        at += static_cast<std::size_t>(K[3]);
      }
    b = e;
  }
}

// Where the piece's values start in the tensor when they are one run of it, else -1.
std::int64_t contiguous_start(const std::vector<std::int64_t>& h, std::int64_t gcols) {
  std::int64_t start = -1, next = -1;
  bool one = true;
  for_each_run(h, gcols, [&](std::size_t g, std::size_t, std::size_t len) {
    if (start < 0) start = static_cast<std::int64_t>(g);
    else if (static_cast<std::int64_t>(g) != next) one = false;
    next = static_cast<std::int64_t>(g + len);
  });
  return one ? start : -1;
}

std::size_t count_of(const std::vector<std::int64_t>& h) {
  std::size_t n = 0;
  for (std::int64_t b = 0; b < h[1]; ++b) n += static_cast<std::size_t>(h[2 + 4 * b + 2] * h[2 + 4 * b + 3]);
  return n;
}

void send_values(const float* v, std::size_t n, MPI_Comm world) {
  for (std::size_t o = 0; o < n; o += kChunk)
    MESHTRAIN_MPI_CHECK(MPI_Send(v + o, static_cast<int>(std::min(kChunk, n - o)), MPI_FLOAT, 0,
                                 kDataTag, world));
}

void recv_values(float* v, std::size_t n, int from, MPI_Comm world) {
  for (std::size_t o = 0; o < n; o += kChunk)
    MESHTRAIN_MPI_CHECK(MPI_Recv(v + o, static_cast<int>(std::min(kChunk, n - o)), MPI_FLOAT,
                                 from, kDataTag, world, MPI_STATUS_IGNORE));
}

}  // namespace

template <class T>
io::HfExportStats Engine<T>::export_hf(const std::string& dir, const io::HfExportOptions& opt) {
  const MPI_Comm world = ctx_->mesh().world().get();
  const int me = world_rank(), W = world_size();
  const model::ParameterRegistry& reg = model_->registry();
  const ExecSpace exec = model_->exec();
  const int zero = ctx_->config().dp.zero_stage;
  io::HfExportStats stats;
  Meter meter{stats};

  // The values this rank sends: the compute-type parameters (what the model computes with; a
  // 16-bit run's fp32 master is in its checkpoints), from the ZeRO-3 shard or the full buffer.
  const bool shard = zero == 3;
  View1<const T> src = shard ? View1<const T>(sync_->shard_params()) : View1<const T>(model_->params());
  // What this rank sends is what it writes to checkpoints (parallel::ownership); its values
  // sit at the flat offset in the full buffer, at the shard offset in the ZeRO-3 shard.
  std::map<std::string, std::vector<Source>> mine;
  for (const OwnedPiece& o : owned_pieces(reg, ownership_here(), true)) {
    const optim::ShardPiece& r = o.range;
    mine[o.piece.param->name].push_back(
        {o.piece, (shard ? r.shard : r.flat) + (o.piece.flat_offset() - r.flat)});
  }
  // This rank's values of a piece as fp32 in `dst` (host).
  HostView1<float> staging;
  auto stage = [&](const Source& s, float* dst) {
    const std::size_t n = s.piece.count;
    auto part = Kokkos::subview(src, std::make_pair(s.at, s.at + n));
    HostView1<float> out(dst, n);
    exec.fence();
    if constexpr (std::is_same_v<T, float>) {
      Kokkos::deep_copy(out, part);
    } else {
      View1<float> tmp = alloc<float>("export.convert", n);
      Kokkos::parallel_for(
          "meshtrain::export_to_float",
          Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(n)),
          KOKKOS_LAMBDA(const std::int64_t i) { tmp(i) = static_cast<float>(part(i)); });
      exec.fence();
      Kokkos::deep_copy(out, tmp);
    }
  };

  std::unique_ptr<io::HfFolderWriter> writer;
  std::exception_ptr error;
  auto guard = [&](auto&& f) {
    if (error) return;
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  };
  const model::ParameterRegistry whole(cfg_, 0, 1, 0, 0, cfg_.n_layer, true, true);
  if (me == 0) guard([&] { writer = std::make_unique<io::HfFolderWriter>(cfg_, dir, opt); });
  std::vector<int> counts(static_cast<std::size_t>(W));
  for (const auto& g : whole.params()) {
    int stop = error ? 1 : 0;
    MESHTRAIN_MPI_CHECK(MPI_Bcast(&stop, 1, MPI_INT, 0, world));
    if (stop) break;
    static const std::vector<Source> none;
    const auto it = mine.find(g.name);
    const std::vector<Source>& own = it == mine.end() ? none : it->second;
    int n = static_cast<int>(own.size());
    MESHTRAIN_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world));
    if (me != 0) {
      for (const Source& s : own) {
        bool failed = false;
        try {
          staging = meter.take("meshtrain::export.piece", s.piece.count);
          stage(s, staging.data());
        } catch (...) {
          failed = true;
        }
        const std::vector<std::int64_t> h = header_of(s.piece, failed);
        MESHTRAIN_MPI_CHECK(MPI_Send(h.data(), static_cast<int>(h.size()), MPI_INT64_T, 0,
                                     kHeaderTag, world));
        if (!failed) send_values(staging.data(), s.piece.count, world);
        meter.give(staging);
        ++stats.pieces_sent;
      }
      continue;
    }
    // Rank 0: the tensor, assembled from every rank's pieces (its own first).
    const std::int64_t gcols = global_cols(g);
    HostView1<float> tensor;
    guard([&] { tensor = meter.take("meshtrain::export.tensor", g.numel); });
    auto place = [&](const std::vector<std::int64_t>& h, const auto& fill) {
      // Values straight into the tensor when they are one run of it, else staged and scattered.
      const std::size_t cnt = count_of(h);
      const std::int64_t at = contiguous_start(h, gcols);
      if (!error && at >= 0) {
        fill(tensor.data() + at);
        return;
      }
      HostView1<float> tmp = meter.take("meshtrain::export.piece", cnt);
      fill(tmp.data());
      if (!error)
        for_each_run(h, gcols, [&](std::size_t gi, std::size_t li, std::size_t len) {
          std::copy(tmp.data() + li, tmp.data() + li + len, tensor.data() + gi);
        });
      meter.give(tmp);
    };
    for (const Source& s : own)
      place(header_of(s.piece, false), [&](float* dst) { guard([&] { stage(s, dst); }); });
    for (int r = 1; r < W; ++r)
      for (int k = 0; k < counts[static_cast<std::size_t>(r)]; ++k) {
        MPI_Status st;
        MESHTRAIN_MPI_CHECK(MPI_Probe(r, kHeaderTag, world, &st));
        int len = 0;
        MESHTRAIN_MPI_CHECK(MPI_Get_count(&st, MPI_INT64_T, &len));
        std::vector<std::int64_t> h(static_cast<std::size_t>(len));
        MESHTRAIN_MPI_CHECK(
            MPI_Recv(h.data(), len, MPI_INT64_T, r, kHeaderTag, world, MPI_STATUS_IGNORE));
        if (h[0] != 0) {
          if (!error)
            error = std::make_exception_ptr(
                Error(cat("rank ", r, " could not read its piece of ", g.name)));
          continue;
        }
        place(h, [&](float* dst) { recv_values(dst, count_of(h), r, world); });
      }
    guard([&] { writer->append(g, tensor.data()); });
    meter.give(tensor);
    ++stats.tensors;
  }
  if (me == 0) guard([&] { writer->finish(); });
  writer.reset();  // an unfinished writer removes its partial files
  meshtrain::agree(world, cat("exporting the HuggingFace folder '", dir, "'"), [&] {
    if (error) std::rethrow_exception(error);
  });
  return stats;
}

#define MESHTRAIN_ENGINE_EXPORT(T) \
  template io::HfExportStats Engine<T>::export_hf(const std::string&, const io::HfExportOptions&);
MESHTRAIN_ENGINE_EXPORT(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_ENGINE_EXPORT(bf16)
MESHTRAIN_ENGINE_EXPORT(fp16)
#endif
#undef MESHTRAIN_ENGINE_EXPORT

}  // namespace meshtrain::parallel
