#pragma once
// What the checkpoint writer and reader share (private to src/io): the tensor list of a model,
// the mapping of a rank's pieces onto datasets and HDF5 selections of pieces. Errors are agreed
// across ranks with core/agree.
#include <mpi.h>

#include <type_traits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hdf5_util.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/io/checkpoint.hpp"

namespace meshtrain::io::ckpt {

// The registry of the whole model on one rank (tp = 1, one stage, every block): the names and
// global shapes of every tensor a checkpoint holds, in a fixed order every rank agrees on.
model::ParameterRegistry full_registry(const model::GptConfig& cfg);

std::string dataset_path(const std::string& prefix, const std::string& name);

// For each tensor of the full registry, the indices of the pieces of `pieces` that belong to it.
// Error when a piece names a parameter the model does not have or another global shape.
std::vector<std::vector<int>> pieces_by_tensor(const model::ParameterRegistry& full,
                                               const std::vector<TensorPiece>& pieces,
                                               const std::string& prefix);

// File-space selection of a piece's global elements (union of hyperslabs) in a copy of
// `file_space`; or nothing.
h5::Handle piece_selection(hid_t file_space, const TensorPiece& piece);
h5::Handle empty_selection(hid_t file_space);
// A 1-D memory space of `count` elements, all selected (count = 0: nothing selected).
h5::Handle memory_space(std::size_t count);

// Dataset transfer lists: collective or independent MPI-IO.
h5::Handle transfer_list(bool collective);

// How one tensor's data moves. Collective: as many collective calls as the rank with most pieces
// of it needs (ranks with fewer take part with empty selections). Independent: each rank writes
// or reads its pieces on its own, which `Transfer::automatic` chooses when every rank's pieces
// of the tensor are at most one contiguous run of the file (no two-phase exchange to gain, and no
// rank waits for another).
struct TensorTransfer {
  int rounds = 0;
  bool independent = false;
};
// `mine[t]`: indices into `pieces` of this rank's pieces of tensor t. Collective (all-reduces).
std::vector<TensorTransfer> plan_transfers(MPI_Comm comm, const std::vector<std::vector<int>>& mine,
                                           const std::vector<TensorPiece>& pieces, Transfer mode);

// Moves this rank's pieces `mine` of dataset `d` between the file and data[i] (float* to read,
// const float* to write).
template <class Ptr>
void transfer(hid_t d, const TensorTransfer& how, const std::vector<int>& mine,
              const std::vector<TensorPiece>& pieces, const std::vector<Ptr>& data,
              hid_t collective, hid_t independent) {
  constexpr bool kWrite = std::is_const_v<std::remove_pointer_t<Ptr>>;
  h5::Handle fspace(MESHTRAIN_H5_CHECK(H5Dget_space(d)), H5Sclose);
  auto move = [&](const TensorPiece* pc, Ptr buf, hid_t dxpl) {
    h5::Handle fsel = pc ? piece_selection(fspace, *pc) : empty_selection(fspace);
    h5::Handle msp = memory_space(pc ? pc->count : 0);
    if constexpr (kWrite) MESHTRAIN_H5_CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, msp, fsel, dxpl, buf));
    else MESHTRAIN_H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, msp, fsel, dxpl, buf));
  };
  if (how.independent) {
    for (int i : mine) move(&pieces[static_cast<std::size_t>(i)], data[static_cast<std::size_t>(i)], independent);
    return;
  }
  float dummy = 0.0f;
  for (int r = 0; r < how.rounds; ++r) {
    if (r < static_cast<int>(mine.size())) {
      const auto i = static_cast<std::size_t>(mine[static_cast<std::size_t>(r)]);
      move(&pieces[i], data[i], collective);
    } else {
      move(nullptr, &dummy, collective);
    }
  }
}
// File access list: MPI-IO on `comm`, collective metadata reads and writes.
h5::Handle mpio_access(MPI_Comm comm);

// Root attributes holding the model configuration.
struct ModelKey {
  const char* attr;  // "model.n_layer"
  int model::GptConfig::*field;
};
const std::vector<ModelKey>& model_keys();

// The block description (model.family, model.norm, ..., model.rope_*) as root attributes, each
// written as text. A file without them predates them and holds a GPT-2 model: reading fills
// GptConfig's defaults, which are GPT-2's.
std::vector<std::pair<std::string, std::string>> block_attributes(const model::GptConfig& c);
void set_block_attribute(model::GptConfig& c, const std::string& key, const std::string& value,
                         const std::string& where);

// The /state group (checkpoint_state.cpp). broadcast_state makes every rank hold rank 0's map
// (the datasets are created collectively). write_state: collective over the file's
// communicator; `root` transfers the data. read_state: any rank alone, the whole group (empty
// when the file has none); with `verify`, a checksum mismatch is a ConfigError naming the tensor.
void broadcast_state(MPI_Comm comm, CheckpointState& state);
void write_state(hid_t file, const CheckpointState& state, bool root, hid_t collective);
CheckpointState read_state(hid_t file, const std::string& where, bool verify);

}  // namespace meshtrain::io::ckpt
