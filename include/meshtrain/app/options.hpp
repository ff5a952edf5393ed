#pragma once
// Option groups shared by subcommands, and the objects built from them.
#include <string>

#include "meshtrain/core/config.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/mesh/rank_math.hpp"

namespace meshtrain::app {

namespace po = boost::program_options;

po::options_description mesh_options();  // [mesh] dp, pp, tp, order
po::options_description log_options();   // [log] all_ranks, level
po::options_description parallel_options();  // [tp] [pp] [zero] [dp]
po::options_description comm_options();  // [comm] backend
po::options_description watchdog_options();  // [comm] timeout (train)

// mesh.dp = 0 means "world / (pp * tp)".
mesh::Shape mesh_shape(const po::variables_map& vm, int world_size);
mesh::Order mesh_order(const po::variables_map& vm);
logging::Context log_context(const po::variables_map& vm, int world_rank);

}  // namespace meshtrain::app
