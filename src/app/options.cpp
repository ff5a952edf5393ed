#include "meshtrain/app/options.hpp"

#include <type_traits>

#include "meshtrain/core/error.hpp"

namespace meshtrain::app {

po::options_description mesh_options() {
  po::options_description d("Process mesh [mesh]");
  d.add_options()
      ("mesh.dp", po::value<int>()->default_value(0),
       "data-parallel size; 0 = world / (cp * pp * tp)")
      ("mesh.cp", po::value<int>()->default_value(1),
       "context-parallel size: each sequence split over cp ranks (2 cp chunks, rank r holding "
       "chunks r and 2cp-1-r, balanced for causal attention); train.seq_len must be divisible "
       "by 2 cp")
      ("mesh.pp", po::value<int>()->default_value(1), "pipeline-parallel size (stages)")
      ("mesh.tp", po::value<int>()->default_value(1), "tensor-parallel size (keep within a node)")
      ("mesh.ep", po::value<int>()->default_value(1),
       "expert-parallel size (MoE models): experts split over ep ranks carved out of dp; "
       "expert gradients reduce over the expert-data-parallel group of dp / ep ranks; "
       "mesh.ep x mesh.tp x mesh.pp must divide the world")
      ("mesh.order", po::value<std::string>()->default_value("tp-dp-pp"),
       "rank order of the axes, fastest-varying first (tp, dp, pp and optionally cp; cp not "
       "named comes right after tp)");
  return d;
}

po::options_description parallel_options() {
  po::options_description d("Parallelism [tp] [pp] [zero] [dp]");
  d.add_options()
      ("tp.sequence_parallel", po::value<bool>()->default_value(false)->implicit_value(true),
       "shard LayerNorm/residual activations along the sequence over the tp group")
      ("cp.comm", po::value<std::string>()->default_value("ring"),
       "how attention crosses mesh.cp: ring (keys and values passed round while each block is "
       "computed) or all_gather (gather them all first: fewer, larger messages, for small cp)")
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
       "launch each bucket's reduction as soon as its gradients are ready")
      ("dp.zero_grads_always", po::value<bool>()->default_value(false)->implicit_value(true),
       "zero every gradient at each step's start, also those the weight-gradient GEMMs "
       "overwrite on their first write (same results; for A/B checks)");
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

po::options_description profile_options() {
  po::options_description d("Profiling [profile]");
  d.add_options()
      ("profile.nvtx", po::value<bool>()->default_value(false)->implicit_value(true),
       "NVTX ranges for Nsight Systems (CUDA builds): steps, forward/backward per block, the "
       "optimizer, each collective with its bytes and group, pipeline sends/receives, checkpoint "
       "phases; off: one untaken branch per range")
      ("profile.steps", po::value<std::string>()->default_value(""),
       "A:B: cudaProfilerStart before step A, cudaProfilerStop after step B (1-based, as the "
       "progress lines count), for nsys --capture-range=cudaProfilerApi (CUDA builds)");
  return d;
}

mesh::Shape mesh_shape(const po::variables_map& vm, int world_size) {
  mesh::Shape s;
  s.pp = vm["mesh.pp"].as<int>();
  s.tp = vm["mesh.tp"].as<int>();
  s.dp = vm["mesh.dp"].as<int>();
  s.ep = vm.count("mesh.ep") ? vm["mesh.ep"].as<int>() : 1;
  s.cp = vm.count("mesh.cp") ? vm["mesh.cp"].as<int>() : 1;
  // Each size is checked before any product of them divides the world.
  if (s.ep <= 0) throw ConfigError(cat("mesh.ep=", s.ep, " must be a positive integer"));
  if (s.cp <= 0) throw ConfigError(cat("mesh.cp=", s.cp, " must be a positive integer"));
  if (s.pp <= 0) throw ConfigError(cat("mesh.pp=", s.pp, " must be a positive integer"));
  if (s.tp <= 0) throw ConfigError(cat("mesh.tp=", s.tp, " must be a positive integer"));
  if (world_size % (static_cast<long>(s.ep) * s.tp * s.pp * s.cp) != 0)
    throw ConfigError(cat("mesh.ep x mesh.tp x mesh.pp", s.cp > 1 ? " x mesh.cp" : "", " = ",
                          s.ep, " x ", s.tp, " x ", s.pp, s.cp > 1 ? cat(" x ", s.cp) : "",
                          " does not divide the ", world_size, " ranks of the job (experts are "
                          "split over ep ranks carved out of dp)"));
  if (s.dp < 0) throw ConfigError(cat("mesh.dp=", s.dp, " must be positive (or 0 to derive it)"));
  if (s.dp == 0) {
    if (world_size % (s.pp * s.tp * s.cp) != 0)
      throw ConfigError(cat("mesh.pp x mesh.tp", s.cp > 1 ? " x mesh.cp" : "", " = ",
                            s.pp * s.tp * s.cp, " does not divide the ", world_size,
                            " ranks of the job, so mesh.dp cannot be derived"));
    s.dp = world_size / (s.pp * s.tp * s.cp);
  }
  mesh::validate(s, world_size);
  return s;
}

po::options_description moe_options() {
  po::options_description d("Mixture of Experts [moe] (docs/moe.md)");
  d.add_options()
      ("moe.experts", po::value<int>(), "experts per MoE block (E); 0: a dense model")
      ("moe.top_k", po::value<int>(), "experts per token, 1-8 and <= moe.experts (default 2)")
      ("moe.layer_freq", po::value<int>(),
       "every n-th block (blocks l with l % n == 0) is an MoE block (default 1: all)")
      ("moe.ffn_hidden_size", po::value<int>(),
       "each expert's intermediate size; 0 (default): the dense MLP width")
      ("moe.shared_expert_size", po::value<int>(),
       "intermediate size of a shared expert every token goes through; 0 (default): none")
      ("moe.router_score", po::value<std::string>(),
       "softmax (default; top-k renormalised when k > 1) or sigmoid (per-token normalised "
       "sigmoid scores, DeepSeek-V3)")
      ("moe.expert_bias", po::value<bool>()->implicit_value(true),
       "sigmoid router: DeepSeek-V3's auxiliary-loss-free balancing, a per-expert bias added to "
       "the scores for choosing only, moved after each step from the global load (default "
       "false; saved in checkpoints)")
      ("moe.expert_bias_rate", po::value<double>(),
       "the bias update speed: bias_e += rate * sign(mean load - load_e) (default 0.001)")
      ("moe.router_fp64", po::value<bool>()->implicit_value(true),
       "run the router in fp64 (layout comparisons without top-k tie flips; default false)")
      ("moe.aux_loss_coeff", po::value<double>(),
       "Switch load-balancing loss coefficient (default 0.01)")
      ("moe.aux_loss_scope", po::value<std::string>(),
       "tokens the load-balancing statistics count: global (default; micro-batch m of every "
       "data-parallel rank together, the same sequences in every layout with the same "
       "train.grad_accum) or local (this rank's micro-batch: the same in every layout with the "
       "same train.micro_batch)")
      ("moe.z_loss_coeff", po::value<double>(), "router z-loss coefficient (default 0)")
      ("moe.capacity_factor", po::value<double>(),
       "cap tokens per expert at ceil(factor N k / E), dropping lowest router probability "
       "first; absent (default): dropless; when given it must be > 0");
  return d;
}

void apply_moe_options(const po::variables_map& vm, model::GptConfig& c) {
  auto over = [&](const char* key, auto& field) {
    if (vm.count(key)) field = vm[key].as<std::remove_reference_t<decltype(field)>>();
  };
  over("moe.experts", c.moe.experts);
  over("moe.top_k", c.moe.top_k);
  over("moe.layer_freq", c.moe.layer_freq);
  over("moe.ffn_hidden_size", c.moe.ffn);
  over("moe.shared_expert_size", c.moe.shared_ffn);
  over("moe.router_score", c.moe.router_score);
  over("moe.router_fp64", c.moe.router_fp64);
  over("moe.expert_bias", c.moe.expert_bias);
  over("moe.expert_bias_rate", c.moe.expert_bias_rate);
  over("moe.aux_loss_coeff", c.moe.aux_loss_coeff);
  over("moe.aux_loss_scope", c.moe.aux_loss_scope);
  over("moe.z_loss_coeff", c.moe.z_loss_coeff);
  over("moe.capacity_factor", c.moe.capacity_factor);
  if (vm.count("moe.capacity_factor"))
    MESHTRAIN_CONFIG_CHECK(c.moe.capacity_factor > 0, "moe.capacity_factor=",
                           c.moe.capacity_factor, " must be > 0 (leave it out for dropless)");
  if (c.moe.experts != 0) c.validate();  // one message naming the moe.* option
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
