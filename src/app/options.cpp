#include "meshtrain/app/options.hpp"

namespace meshtrain::app {

po::options_description mesh_options() {
  po::options_description d("Process mesh [mesh]");
  d.add_options()
      ("mesh.dp", po::value<int>()->default_value(0),
       "data-parallel size; 0 = world / (pp * tp)")
      ("mesh.pp", po::value<int>()->default_value(1), "pipeline-parallel size (stages)")
      ("mesh.tp", po::value<int>()->default_value(1), "tensor-parallel size (keep within a node)")
      ("mesh.order", po::value<std::string>()->default_value("tp-dp-pp"),
       "rank order of the axes, fastest-varying first");
  return d;
}

po::options_description parallel_options() {
  po::options_description d("Parallelism [tp] [pp] [zero] [dp]");
  d.add_options()
      ("tp.sequence_parallel", po::value<bool>()->default_value(false)->implicit_value(true),
       "shard LayerNorm/residual activations along the sequence over the tp group")
      ("pp.schedule", po::value<std::string>()->default_value("1f1b"),
       "pipeline schedule: gpipe, 1f1b or interleaved (micro-batches per step = "
       "train.grad_accum)")
      ("pp.virtual_chunks", po::value<int>()->default_value(1),
       "model chunks per pipeline rank (interleaved schedule only)")
      ("pp.layers", po::value<std::string>()->default_value(""),
       "explicit blocks per stage (per virtual chunk), e.g. 4,4,3,1; default: balanced by cost")
      ("zero.stage", po::value<int>()->default_value(0),
       "ZeRO stage over the dp group: 0 (DDP), 1 (optimizer state), 2 (+ gradients), "
       "3 (+ parameters)")
      ("zero.offload_optimizer", po::value<std::string>()->default_value("none"),
       "none or cpu: master weights, Adam state and the optimizer step in host memory")
      ("dp.bucket_mb", po::value<double>()->default_value(25.0),
       "gradient bucket size in MB for the overlapped dp reduction")
      ("dp.overlap", po::value<bool>()->default_value(true)->implicit_value(true),
       "launch each bucket's reduction as soon as its gradients are ready");
  return d;
}

po::options_description log_options() {
  po::options_description d("Logging [log]");
  d.add_options()
      ("log.all_ranks", po::value<bool>()->default_value(false)->implicit_value(true),
       "print on every rank with a [rank r dp/pp/tp] prefix (default: rank 0 only)")
      ("log.level", po::value<std::string>()->default_value("info"), "debug, info, warn or error");
  return d;
}

po::options_description comm_options() {
  po::options_description d("Communication [comm]");
  d.add_options()
      ("comm.backend", po::value<std::string>()->default_value("auto"),
       "auto (NCCL for GPU tensors when built, else MPI), mpi or nccl");
  return d;
}

po::options_description watchdog_options() {
  po::options_description d("Collective watchdog [comm]");
  d.add_options()
      ("comm.timeout", po::value<double>()->default_value(300.0),
       "seconds an operation of a communicator may stay outstanding before the watchdog dumps "
       "the flight recorders to <train.out_dir>/flight_<rank>.json, names the ranks that did not "
       "arrive and aborts the job; 0 = no watchdog");
  return d;
}

mesh::Shape mesh_shape(const po::variables_map& vm, int world_size) {
  mesh::Shape s;
  s.pp = vm["mesh.pp"].as<int>();
  s.tp = vm["mesh.tp"].as<int>();
  s.dp = vm["mesh.dp"].as<int>();
  if (s.pp <= 0) throw ConfigError(cat("mesh.pp=", s.pp, " must be a positive integer"));
  if (s.tp <= 0) throw ConfigError(cat("mesh.tp=", s.tp, " must be a positive integer"));
  if (s.dp < 0) throw ConfigError(cat("mesh.dp=", s.dp, " must be positive (or 0 to derive it)"));
  if (s.dp == 0) {
    if (world_size % (s.pp * s.tp) != 0)
      throw ConfigError(cat("mesh.pp x mesh.tp = ", s.pp * s.tp, " does not divide the ",
                            world_size, " ranks of the job, so mesh.dp cannot be derived"));
    s.dp = world_size / (s.pp * s.tp);
  }
  mesh::validate(s, world_size);
  return s;
}

mesh::Order mesh_order(const po::variables_map& vm) {
  return mesh::Order::parse(vm["mesh.order"].as<std::string>());
}

logging::Context log_context(const po::variables_map& vm, int world_rank) {
  logging::Context c;
  c.world_rank = world_rank;
  c.all_ranks = vm["log.all_ranks"].as<bool>();
  c.level = logging::parse_level(vm["log.level"].as<std::string>());
  return c;
}

}  // namespace meshtrain::app
