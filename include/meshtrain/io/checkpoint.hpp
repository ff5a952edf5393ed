#pragma once
// Parallel HDF5 checkpoints (DESIGN "Checkpoints", issue 8).
//
// One file per checkpoint, <dir>/step_XXXXXXXX.h5, written collectively through MPI-IO. Every
// tensor is a global fp32 dataset with its global shape: /model/<name>, /optim/exp_avg/<name>,
// /optim/exp_avg_sq/<name> (HuggingFace GPT-2 names, the registry's global shapes; wte keeps its
// padded vocabulary rows). A rank writes and reads *pieces*: runs of its tensor-parallel slice of a
// parameter, usually cut out of its ZeRO partition of the flat buffer. Because the file holds
// global tensors, any layout restores any other: each rank reads the hyperslabs that its new
// pieces need.
//
// Commit is atomic: the file is written as step_XXXXXXXX.h5.tmp, closed and synced; rank 0
// renames it and then replaces `latest` (a text file holding the checkpoint's file name) by
// write-and-rename. A crash at any point leaves the previous checkpoint and `latest` usable.
//
// Each dataset carries a layout-free checksum (attribute `checksum`): the sum mod 2^64 over its
// elements of a bijective 64-bit mix of (global element index, float bits). Ranks sum the
// elements they hold and all-reduce, so any layout computes the same value, and a change to any
// single element always changes it.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::io {

inline constexpr const char* kCheckpointFormat = "meshtrain-checkpoint";
inline constexpr int kCheckpointVersion = 1;
// Group prefixes of the three tensor families.
inline constexpr const char* kModelPrefix = "model";
inline constexpr const char* kExpAvgPrefix = "optim/exp_avg";
inline constexpr const char* kExpAvgSqPrefix = "optim/exp_avg_sq";

// ---- what a rank holds ---------------------------------------------------------------------

// Elements [local_begin, local_begin + count) (row-major) of tensor-parallel slice `tp_rank` of
// `tp_size` of parameter `param` (which belongs to a registry that must outlive the piece).
struct TensorPiece {
  const model::ParamInfo* param = nullptr;
  int tp_rank = 0, tp_size = 1;
  std::size_t local_begin = 0, count = 0;
  // This rank is the designated holder of these elements among the copies that tensor
  // parallelism and the tied embedding create (ParameterRegistry::counts_in_norm). Saving writes
  // primary pieces only; verification counts primary pieces only.
  bool primary = true;
  // Position of the piece in the flat buffer its registry describes.
  std::size_t flat_offset() const { return param->offset + local_begin; }
};

// The pieces of the registry's parameters that lie in [flat_lo, flat_hi) of its flat buffer (a
// ZeRO / data-parallel partition), in flat order; alignment gaps belong to no parameter. With
// `dedup`, pieces that another rank also holds are dropped (replicated tensors on tp rank != 0,
// wte on a stage without the embedding); without it they are kept with primary = false.
// Each data-parallel replica passing its own partition range of the same registry makes the
// union of primary pieces over the world cover every global element exactly once.
std::vector<TensorPiece> pieces_for_range(const model::ParameterRegistry& reg,
                                          std::size_t flat_lo, std::size_t flat_hi, bool dedup);

// A rectangle [row0, row0 + rows) x [col0, col0 + cols) of a global tensor seen as a matrix; a
// 1-D tensor is one row (row0 = 0, rows = 1).
struct Block {
  std::int64_t row0 = 0, col0 = 0, rows = 0, cols = 0;
};

// The global elements of a piece as disjoint rectangles of the parameter's global shape: rows
// split, a contiguous row block; cols split, a column block; qkv_cols, three column blocks per row
// range; a partial first and last row of a range become their own blocks. The tensor-parallel
// index maps are increasing, so these elements in global row-major order (the order in which
// HDF5 transfers a union of hyperslabs) are the piece's elements in local order.
std::vector<Block> global_blocks(const TensorPiece& piece);

// One term of the checksum: bijective in `bits` for a fixed index.
std::uint64_t checksum_term(std::uint64_t global_index, std::uint32_t bits);
// Sum of the terms of a piece's elements (`data` holds its `count` values).
std::uint64_t piece_checksum(const TensorPiece& piece, const float* data);

// How raw data moves between ranks and the file (metadata is always collective).
enum class Transfer {
  automatic,    // independent for a tensor whose pieces are one contiguous file run on every
                // rank (tp = 1, rows-split and replicated tensors), collective otherwise
  collective,   // MPI-IO collective (two-phase) for every tensor
  independent,  // each rank on its own for every tensor
};

// ---- attributes --------------------------------------------------------------------------------

struct SavedLayout {
  int dp = 1, pp = 1, tp = 1, zero = 0;
  std::string order = "tp-dp-pp";
  int cp = 1;  // files written before context parallelism have no layout.cp: 1
};
// "dp 2 x pp 2 x tp 2, ZeRO 1" (" x cp 2" after dp when cp > 1)
std::string describe(const SavedLayout& l);

// Small replicated tensors that are not parameters, by name (the routers' expert biases:
// "h.<l>.mlp.router.expert_bias"): 1-D float32 datasets /state/<name>, each with a checksum.
using CheckpointState = std::map<std::string, std::vector<float>>;

// Root attributes of a checkpoint. Save takes them from rank 0 (every rank must pass the same
// model configuration); load returns what the file holds.
struct CheckpointAttributes {
  std::int64_t step = 0;           // set by save from its `step` argument
  std::int64_t tokens_seen = 0;
  std::uint64_t seed = 0;
  double loss_scale = 1.0;         // DynamicLossScaler state
  std::int64_t loss_scale_good_steps = 0, loss_scale_skipped = 0;
  std::string config_text;         // the resolved configuration (INI)
  model::GptConfig model;          // stored as model.* attributes, checked on load
  SavedLayout layout;              // the layout that saved the file
  std::map<std::string, std::string> extra;  // free-form, stored as "extra.<key>"
  CheckpointState state;           // save: rank 0's is written; load: every rank reads all
  // Written by save, filled by load.
  std::string format;              // kCheckpointFormat
  int format_version = 0;
  std::string software_version;    // meshtrain version and build
  std::string created;             // ISO-8601 UTC, e.g. 2024-05-01T12:00:00Z
  std::string path;                // load: the file that was read
};

// ---- save ----------------------------------------------------------------------------------------

// A family of tensors to save: data[i] (host memory) holds pieces[i].count values.
struct SaveGroup {
  std::string prefix;  // kModelPrefix, kExpAvgPrefix, kExpAvgSqPrefix
  std::vector<TensorPiece> pieces;
  std::vector<const float*> data;
};

// "step_00001000.h5"
std::string checkpoint_file_name(std::int64_t step);

// Saving in two collective phases, so that the commit can be left out (a simulated crash).
class CheckpointWriter {
 public:
  CheckpointWriter(MPI_Comm comm, std::string dir, std::int64_t step);
  // Creates <dir> and writes <dir>/step_XXXXXXXX.h5.tmp: every dataset of the model that
  // attrs.model describes in every group (the same prefixes on every rank), each rank's primary
  // pieces, the checksums, the root attributes; closes it. Before writing anything, checks that
  // the primary pieces of each tensor add up to its global size over the world (Error otherwise:
  // duplicate writers or missing pieces).
  void write(const CheckpointAttributes& attrs, const std::vector<SaveGroup>& groups,
             Transfer transfer = Transfer::automatic);
  // Rank 0 syncs the file, renames it to its final name, points `latest` at it, deletes the
  // *.h5.tmp files that crashed saves left behind and (keep > 0) the oldest complete checkpoints
  // beyond the newest `keep`. Returns the final path.
  std::string commit(int keep = 0);

  // Runs on every rank once its data is written, before the collective close (test hooks: a
  // background write held while its file is incomplete).
  void set_before_close(std::function<void()> f) { before_close_ = std::move(f); }

  const std::string& tmp_path() const { return tmp_; }
  const std::string& path() const { return final_; }

 private:
  MPI_Comm comm_;
  std::string dir_, final_, tmp_;
  std::int64_t step_;
  bool written_ = false;
  std::function<void()> before_close_;
};

// write + commit. Collective over `comm`. Returns the path of the committed file.
std::string save_checkpoint(MPI_Comm comm, const std::string& dir, std::int64_t step,
                            const CheckpointAttributes& attrs, const std::vector<SaveGroup>& groups,
                            int keep = 0, Transfer transfer = Transfer::automatic);

// ---- load ----------------------------------------------------------------------------------------

// A family of tensors to read: pieces[i].count values go to data[i] (host memory). Pieces may
// overlap across ranks (every tp or dp replica reads what it needs).
struct LoadGroup {
  std::string prefix;
  std::vector<TensorPiece> pieces;
  std::vector<float*> data;
};

// The checkpoint file that `spec` names, decided on rank 0 and broadcast: a step_*.h5 file; a
// directory (its `latest`); a `latest` file; or the word "latest" (then `dir`/latest).
// ConfigError naming the path and what to do when nothing is there.
std::string resolve_checkpoint(MPI_Comm comm, const std::string& spec, const std::string& dir = "");

// Collective: reads every piece of every group from the checkpoint `spec` names (see
// resolve_checkpoint) and returns its attributes. ConfigError (same on every rank) when the file
// is missing, truncated or not a meshtrain checkpoint, when its model differs from `current`
// (naming the key), when a tensor is missing or has another shape. With `verify`, recomputes each
// read tensor's checksum: from the primary pieces when they cover each element once over the
// world (free), otherwise by re-reading that tensor in even slices; a mismatch is a ConfigError
// naming the tensor and the file.
CheckpointAttributes load_checkpoint(MPI_Comm comm, const std::string& spec,
                                     const model::GptConfig& current,
                                     const std::vector<LoadGroup>& groups, bool verify,
                                     const std::string& dir = "",
                                     Transfer transfer = Transfer::automatic);

// ---- export --------------------------------------------------------------------------------------

// One process (no MPI communication): the root attributes of a checkpoint file (no tensors).
// ConfigError naming the file when it is missing or not a meshtrain checkpoint.
CheckpointAttributes read_checkpoint_attributes(const std::string& checkpoint);

// One process (no MPI communication): a HuggingFace folder in `dir` (io/hf_export.hpp: shards,
// index, config.json for the checkpoint's family) from /model/* of a checkpoint, one tensor at
// a time, each checksum verified. Returns the checkpoint's model configuration.
struct HfExportOptions;
model::GptConfig export_hf_from_checkpoint(const std::string& checkpoint, const std::string& dir,
                                           const HfExportOptions& opt);

// Whether this process gave up a parallel HDF5 file after an error (its handles were released,
// not closed: closing is collective). Such a process cannot shut HDF5 and MPI down cleanly (the
// library would flush the file at exit, collectively): the job's error handler aborts it.
bool abandoned_hdf5_files();

}  // namespace meshtrain::io
