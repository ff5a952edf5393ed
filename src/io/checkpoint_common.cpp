#include "checkpoint_common.hpp"

#include <algorithm>
#include <sstream>

#include "meshtrain/core/mpi_check.hpp"

namespace meshtrain::io::ckpt {

model::ParameterRegistry full_registry(const model::GptConfig& cfg) {
  return model::ParameterRegistry(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
}

std::string dataset_path(const std::string& prefix, const std::string& name) {
  return "/" + prefix + "/" + name;
}

std::vector<std::vector<int>> pieces_by_tensor(const model::ParameterRegistry& full,
                                               const std::vector<TensorPiece>& pieces,
                                               const std::string& prefix) {
  std::unordered_map<std::string, int> index;
  for (std::size_t i = 0; i < full.params().size(); ++i)
    index.emplace(full.params()[i].name, static_cast<int>(i));
  std::vector<std::vector<int>> out(full.params().size());
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& pc = pieces[i];
    MESHTRAIN_CHECK(pc.param != nullptr, "checkpoint group '", prefix, "': piece ", i,
                    " has no parameter");
    auto it = index.find(pc.param->name);
    MESHTRAIN_CHECK(it != index.end(), "checkpoint group '", prefix, "': parameter ",
                    pc.param->name, " is not part of the model");
    MESHTRAIN_CHECK(full.params()[it->second].global_shape == pc.param->global_shape,
                    "checkpoint group '", prefix, "': parameter ", pc.param->name,
                    " has another global shape than the model's");
    MESHTRAIN_CHECK(pc.local_begin + pc.count <= pc.param->numel, "checkpoint group '", prefix,
                    "': piece [", pc.local_begin, ", ", pc.local_begin + pc.count, ") of ",
                    pc.param->name, " exceeds its ", pc.param->numel, " local elements");
    if (pc.count > 0) out[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(i));
  }
  return out;
}

h5::Handle piece_selection(hid_t file_space, const TensorPiece& piece) {
  h5::Handle s(MESHTRAIN_H5_CHECK(H5Scopy(file_space)), H5Sclose);
  const int rank = MESHTRAIN_H5_CHECK(H5Sget_simple_extent_ndims(s));
  bool first = true;
  for (const Block& b : global_blocks(piece)) {
    hsize_t start[2], count[2];
    if (rank == 2) {
      start[0] = static_cast<hsize_t>(b.row0), start[1] = static_cast<hsize_t>(b.col0);
      count[0] = static_cast<hsize_t>(b.rows), count[1] = static_cast<hsize_t>(b.cols);
    } else {
      start[0] = static_cast<hsize_t>(b.col0), count[0] = static_cast<hsize_t>(b.cols);
    }
    MESHTRAIN_H5_CHECK(H5Sselect_hyperslab(s, first ? H5S_SELECT_SET : H5S_SELECT_OR, start,
                                           nullptr, count, nullptr));
    first = false;
  }
  if (first) MESHTRAIN_H5_CHECK(H5Sselect_none(s));
  return s;
}

h5::Handle empty_selection(hid_t file_space) {
  h5::Handle s(MESHTRAIN_H5_CHECK(H5Scopy(file_space)), H5Sclose);
  MESHTRAIN_H5_CHECK(H5Sselect_none(s));
  return s;
}

h5::Handle memory_space(std::size_t count) {
  const hsize_t n = std::max<hsize_t>(count, 1);
  h5::Handle s(MESHTRAIN_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  if (count == 0) MESHTRAIN_H5_CHECK(H5Sselect_none(s));
  return s;
}

h5::Handle transfer_list(bool collective) {
  h5::Handle p(MESHTRAIN_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  MESHTRAIN_H5_CHECK(H5Pset_dxpl_mpio(p, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT));
  return p;
}

std::vector<TensorTransfer> plan_transfers(MPI_Comm comm, const std::vector<std::vector<int>>& mine,
                                           const std::vector<TensorPiece>& pieces, Transfer mode) {
  const std::size_t n = mine.size();
  // [t]: rounds (max over ranks), [n + t]: 0 when this rank's pieces are one contiguous run of
  // the file or none (max over ranks: 0 when that holds everywhere).
  std::vector<int> v(2 * n, 0);
  for (std::size_t t = 0; t < n; ++t) {
    v[t] = static_cast<int>(mine[t].size());
    bool one_run = mine[t].size() <= 1;
    if (mine[t].size() == 1) {
      const TensorPiece& pc = pieces[static_cast<std::size_t>(mine[t][0])];
      const auto first = pc.param->global_index(static_cast<std::int64_t>(pc.local_begin),
                                                pc.tp_rank, pc.tp_size);
      const auto last = pc.param->global_index(
          static_cast<std::int64_t>(pc.local_begin + pc.count - 1), pc.tp_rank, pc.tp_size);
      one_run = last - first + 1 == static_cast<std::int64_t>(pc.count);  // indices increase
    }
    v[n + t] = one_run ? 0 : 1;
  }
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT,
                                    MPI_MAX, comm));
  std::vector<TensorTransfer> out(n);
  for (std::size_t t = 0; t < n; ++t) {
    out[t].rounds = v[t];
    out[t].independent = mode == Transfer::independent ||
                         (mode == Transfer::automatic && v[n + t] == 0);
  }
  return out;
}

h5::Handle mpio_access(MPI_Comm comm) {
  h5::Handle p(MESHTRAIN_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MESHTRAIN_H5_CHECK(H5Pset_fapl_mpio(p, comm, MPI_INFO_NULL));
  // Metadata (object headers, attributes, links) is read by one rank and broadcast, and written
  // collectively: a file with hundreds of datasets opens in one round of messages, not one
  // small read per rank per object.
  MESHTRAIN_H5_CHECK(H5Pset_all_coll_metadata_ops(p, true));
  MESHTRAIN_H5_CHECK(H5Pset_coll_metadata_write(p, true));
  // The 1.8 file format (readable by every HDF5 since 1.8, h5py included) stores the many root
  // attributes densely and checksums object headers.
  MESHTRAIN_H5_CHECK(H5Pset_libver_bounds(p, H5F_LIBVER_V18, H5F_LIBVER_V18));
  return p;
}


const std::vector<ModelKey>& model_keys() {
  using C = model::GptConfig;
  static const std::vector<ModelKey> keys = {
      {"model.n_layer", &C::n_layer},       {"model.n_head", &C::n_head},
      {"model.n_embd", &C::n_embd},         {"model.vocab_size", &C::vocab_size},
      {"model.block_size", &C::block_size}, {"model.vocab_pad", &C::vocab_pad},
  };
  return keys;
}

std::vector<std::pair<std::string, std::string>> block_attributes(const model::GptConfig& c) {
  auto num = [](double x) {
    std::ostringstream o;
    o.precision(17);
    o << x;
    return o.str();
  };
  return {{"model.family", model::family_name(c.family)},
          {"model.norm", model::norm_name(c.norm)},
          {"model.positions", model::positions_name(c.positions)},
          {"model.mlp", model::mlp_name(c.mlp)},
          // resolved: a configuration that spells out a default is the same model
          {"model.n_kv_head", std::to_string(c.kv_heads())},
          {"model.head_dim", std::to_string(c.head_size())},
          {"model.intermediate_size", std::to_string(c.mlp_width())},
          {"model.bias", c.bias ? "true" : "false"},
          {"model.qkv_bias", c.qkv_bias ? "true" : "false"},
          {"model.sliding_window", std::to_string(c.sliding_window)},
          {"model.hf_model_type", c.hf_model_type.empty() ? "none" : c.hf_model_type},
          {"model.tied_head", c.tied_head ? "true" : "false"},
          {"model.norm_eps", num(c.norm_eps)},
          {"model.rope_theta", num(c.rope.theta)},
          {"model.rope_scaling", c.rope.llama3_scaling ? "llama3" : "none"},
          {"model.rope_factor", num(c.rope.factor)},
          {"model.rope_low_freq_factor", num(c.rope.low_freq_factor)},
          {"model.rope_high_freq_factor", num(c.rope.high_freq_factor)},
          {"model.rope_original_max_position",
           std::to_string(c.rope.original_max_position_embeddings)},
          // Mixture of Experts: what the parameters' shapes and names depend on (absent: dense)
          {"moe.experts", std::to_string(c.moe.experts)},
          {"moe.layer_freq", std::to_string(c.moe.experts > 0 ? c.moe.layer_freq : 1)},
          {"moe.ffn_hidden_size", std::to_string(c.moe.experts > 0 ? c.expert_width() : 0)},
          {"moe.shared_expert_size", std::to_string(c.moe.shared_ffn)}};
}

void set_block_attribute(model::GptConfig& c, const std::string& key, const std::string& v,
                         const std::string& where) {
  const char* k = key.c_str();
  auto number = [&]() {
    try {
      std::size_t used = 0;
      const double x = std::stod(v, &used);
      if (used == v.size()) return x;
    } catch (const std::exception&) {
    }
    throw ConfigError(cat(where, ": attribute ", key, "='", v, "' is not a number"));
  };
  auto boolean = [&]() {
    MESHTRAIN_CONFIG_CHECK(v == "true" || v == "false", where, ": attribute ", key, "='", v,
                           "' is not true or false");
    return v == "true";
  };
  if (key == "model.family") c.family = model::parse_family(v, k);
  else if (key == "model.norm") c.norm = model::parse_norm(v, k);
  else if (key == "model.positions") c.positions = model::parse_positions(v, k);
  else if (key == "model.mlp") c.mlp = model::parse_mlp(v, k);
  else if (key == "model.n_kv_head") c.n_kv_head = static_cast<int>(number());
  else if (key == "model.head_dim") c.head_dim = static_cast<int>(number());
  else if (key == "model.intermediate_size") c.intermediate_size = static_cast<int>(number());
  else if (key == "model.bias") c.bias = boolean();
  else if (key == "model.qkv_bias") c.qkv_bias = boolean();
  else if (key == "model.sliding_window") c.sliding_window = static_cast<int>(number());
  else if (key == "model.hf_model_type") c.hf_model_type = v == "none" ? "" : v;
  else if (key == "model.tied_head") c.tied_head = boolean();
  else if (key == "model.norm_eps") c.norm_eps = number();
  else if (key == "model.rope_theta") c.rope.theta = number();
  else if (key == "model.rope_scaling") c.rope.llama3_scaling = v == "llama3";
  else if (key == "model.rope_factor") c.rope.factor = number();
  else if (key == "model.rope_low_freq_factor") c.rope.low_freq_factor = number();
  else if (key == "model.rope_high_freq_factor") c.rope.high_freq_factor = number();
  else if (key == "model.rope_original_max_position")
    c.rope.original_max_position_embeddings = static_cast<int>(number());
  else if (key == "moe.experts") c.moe.experts = static_cast<int>(number());
  else if (key == "moe.layer_freq") c.moe.layer_freq = static_cast<int>(number());
  else if (key == "moe.ffn_hidden_size") c.moe.ffn = static_cast<int>(number());
  else if (key == "moe.shared_expert_size") c.moe.shared_ffn = static_cast<int>(number());
  else throw Error(cat("set_block_attribute: unknown key ", key));
}

}  // namespace meshtrain::io::ckpt
