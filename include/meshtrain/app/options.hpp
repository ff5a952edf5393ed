#pragma once
// Option groups shared by subcommands, and the objects built from them.
#include <string>

#include "meshtrain/core/config.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/mesh/rank_math.hpp"
#include "meshtrain/model/config.hpp"

namespace meshtrain::app {

namespace po = boost::program_options;

po::options_description mesh_options();  // [mesh] dp, pp, tp, order
po::options_description log_options();   // [log] all_ranks, level
po::options_description parallel_options();  // [tp] [pp] [zero] [dp]
po::options_description comm_options();  // [comm] backend
po::options_description watchdog_options();  // [comm] timeout (train)
po::options_description profile_options();   // [profile] nvtx, steps (train)
po::options_description moe_options();   // [moe] Mixture of Experts (part of the model's)
// The moe.* options given onto c.moe, validated (ConfigError naming the option).
void apply_moe_options(const po::variables_map& vm, model::GptConfig& c);

// mesh.dp = 0 means "world / (pp * tp)"; mesh.ep x mesh.tp x mesh.pp must divide the world.
mesh::Shape mesh_shape(const po::variables_map& vm, int world_size);
mesh::Order mesh_order(const po::variables_map& vm);
logging::Context log_context(const po::variables_map& vm, int world_rank);

}  // namespace meshtrain::app
