// `meshtrain train`: builds the model (a preset, overrides, or a HuggingFace checkpoint), trains
// it on token shards (saving and restoring parallel HDF5 checkpoints), evaluates, exports it in
// HuggingFace format and prints a sample. A stop signal saves a checkpoint and exits with 3.
#include "meshtrain/app/train_cmd.hpp"

#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <type_traits>

#include "meshtrain/core/memory.hpp"
#include "meshtrain/app/memory_check.hpp"
#include "meshtrain/app/option_checks.hpp"
#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/app/options.hpp"
#include "meshtrain/app/preflight.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/version.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_mixtral.hpp"
#include "meshtrain/io/safetensors.hpp"
#include "meshtrain/io/tokenizer.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/generate.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::app {

namespace {

std::unique_ptr<io::Tokenizer> tokenizer_from(const po::variables_map& vm, const std::string& kind) {
  return io::make_tokenizer(kind, vm["data.vocab_json"].as<std::string>(),
                            vm["data.merges_txt"].as<std::string>());
}

}  // namespace

// What `meshtrain doctor` reads besides the metrics and flight dumps: the resolved
// configuration (config.ini, which `train --config` reads back) and the job (run.json).
void write_run_description(const Runtime& rt, const std::string& out_dir,
                           const std::string& config_text) {
  agree_on_root(rt.world(), "train.out_dir", [&] {
    std::ofstream ini(out_dir + "/config.ini");
    ini << config_text;
    Json run{{"format", "meshtrain-run"}, {"version", kVersion},
             {"world", rt.size()}, {"ranks_per_node", rt.node().size},
             {"devices_per_node", kc::device_count()},
             {"device", kDeviceIsHost ? "host" : "gpu"},
             {"memory_capacity_bytes", device_capacity_bytes()}};
    std::ofstream js(out_dir + "/run.json");
    std::filesystem::remove(out_dir + "/memory.json");  // an earlier run's; this one's at its end
    js << json::dump(run, json::Style{100}) << "\n";
    MESHTRAIN_CONFIG_CHECK(ini.good() && js.good(), "cannot write ", out_dir,
                           "/config.ini and run.json (train.out_dir)");
  });
}

// What train_and_sample reads from the options, read outside it: nvcc's front end (CUDA 13)
// rejects variable_value::as<bool>() inside a function template.
struct OutputOptions {
  bool save = false;
  io::HfExportOptions hf;  // train.save's folder
  std::string init_from, resume, prompt;
  train::SampleConfig sample;
};

OutputOptions read_output_options(const po::variables_map& vm, std::uint64_t seed,
                                  const std::string& tok_kind) {
  OutputOptions o;
  o.save = vm["train.save"].as<bool>();
  o.hf.dtype = io::parse_hf_dtype(vm["train.save_dtype"].as<std::string>(), "train.save_dtype");
  const double shard_mb = vm["train.save_max_shard_mb"].as<double>();
  MESHTRAIN_CONFIG_CHECK(shard_mb > 0, "train.save_max_shard_mb=", shard_mb, " must be positive");
  o.hf.max_shard_bytes = static_cast<std::uint64_t>(shard_mb * 1e6);
  o.hf.tokenizer = tok_kind;
  if (tok_kind == "hf") o.hf.tokenizer_json = vm["data.vocab_json"].as<std::string>();
  o.init_from = vm["model.init_from"].as<std::string>();
  o.resume = vm["train.resume"].as<std::string>();
  o.prompt = vm["train.sample_prompt"].as<std::string>();
  o.sample.max_new_tokens = vm["train.sample_tokens"].as<int>();
  o.sample.temperature = static_cast<float>(vm["train.sample_temperature"].as<double>());
  o.sample.top_k = vm["train.sample_top_k"].as<int>();
  o.sample.seed = seed;
  return o;
}

// Returns false when a stop signal ended training early (a checkpoint was saved; no export).
template <class T>
bool train_and_sample(const po::variables_map& vm, const model::GptConfig& mc,
                      const train::TrainConfig& tc, const io::BlendedDataset& data,
                      const std::string& out_dir,
                      const std::string& tok_kind, MPI_Comm world,
                      const parallel::EngineOptions& eo) {
  // Checked before training, not after it.
  const OutputOptions o = read_output_options(vm, tc.seed, tok_kind);
  parallel::Engine<T> engine(world, mc, eo);
  logging::info("layout: ", engine.describe());
  const std::string advice = engine.advice();
  if (!advice.empty()) logging::warn(advice);
  if (o.init_from.empty()) engine.init_parameters(tc.seed);
  else engine.import_hf(o.init_from);
  train::TrainerT<T> trainer(engine, tc, data);
  if (!o.resume.empty()) trainer.restore(o.resume);
  trainer.run();
  if (trainer.stopped()) return false;

  // The export streams tensor by tensor to rank 0 (no rank holds the whole model).
  if (o.save) {
    const std::string dir = out_dir + "/model";
    engine.export_hf(dir, o.hf);
    logging::info("saved ", dir, " (HuggingFace ", io::hf_architecture(mc), ", ", o.hf.dtype, ")");
  }
  // Sampling runs the whole model on one rank (world rank 0 gathers every rank's slice into a
  // single-rank fp32 model when it does not hold it all): a small-model convenience.
  if (o.sample.max_new_tokens > 0) {
    engine.with_whole_model([&](auto& model) {
      using M = std::remove_reference_t<decltype(model)>;
      auto tok = tokenizer_from(vm, tok_kind);
      auto prompt = tok->encode(o.prompt);
      if (prompt.empty()) prompt.push_back(tok->eot() >= 0 ? tok->eot() : 0);
      M sampler(mc, 1, tc.seq_len);  // batch 1, sharing the trained weights
      sampler.share_parameters(model);
      logging::info("sample:\n", tok->decode(train::generate(sampler, prompt, o.sample)));
    });
  }
  return true;
}

parallel::ParallelConfig parallel_config(const po::variables_map& vm, const mesh::Shape& shape) {
  parallel::ParallelConfig c;
  c.shape = shape;
  c.order = mesh_order(vm);
  c.backend = comm::default_backend();
  const std::string b = vm["comm.backend"].as<std::string>();
  if (b != "auto") c.backend = comm::parse_backend(b);
  c.sequence_parallel = vm["tp.sequence_parallel"].as<bool>();
  c.cp_comm = model::parse_cp_comm(vm["cp.comm"].as<std::string>());
  c.schedule = parallel::parse_schedule_kind(vm["pp.schedule"].as<std::string>());
  c.virtual_chunks = vm["pp.virtual_chunks"].as<int>();
  c.layers = vm["pp.layers"].as<std::string>();
  c.dp.zero_stage = vm["zero.stage"].as<int>();
  const std::string off = vm["zero.offload_optimizer"].as<std::string>();
  MESHTRAIN_CONFIG_CHECK(off == "none" || off == "cpu", "zero.offload_optimizer='", off,
                         "' is not one of none, cpu");
  c.dp.offload = off == "cpu";
  const double mb = vm["dp.bucket_mb"].as<double>();
  MESHTRAIN_CONFIG_CHECK(mb > 0, "dp.bucket_mb=", mb, " must be positive");
  c.dp.bucket_bytes = static_cast<std::size_t>(mb * 1048576.0);
  c.dp.overlap = vm["dp.overlap"].as<bool>();
  c.dp.zero_grads_always = vm["dp.zero_grads_always"].as<bool>();
  return c;
}

int cmd_train(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = train_options();
  const DsParsed ds = parse_with_deepspeed(
      args, desc, [&](const po::variables_map& base) { return train_context(base, rt.size()); },
      train_layer);
  const config::Parsed& p = ds.parsed;
  logging::set_context(log_context(p.vm, rt.rank()));
  if (ds.used()) {
    logging::info("options from ", ds.mapping.file, " (--deepspeed): ", ds.mapping.options.size(),
                  " set", ds.mapping.global_batch > 0
                              ? cat(", global batch ", ds.mapping.global_batch, " = micro-batch ",
                                    ds.mapping.micro_batch, " x accumulation ",
                                    ds.mapping.grad_accum, " x dp")
                              : std::string());
    if (!ds.mapping.warning().empty()) logging::warn(ds.mapping.warning());
    if (!ds.mapping.note().empty()) logging::info(ds.mapping.note());
  }
  mesh::Shape shape;
  parallel::ParallelConfig pc;
  model::GptConfig mc;
  with_deepspeed_origin(ds, [&] {
    check_train_options(p.vm);
    shape = mesh_shape(p.vm, rt.size());
    pc = parallel_config(p.vm, shape);
    mc = model_config(p.vm);
  });
  // A Mixtral folder's experts split over mesh.ep: named with the file the count came from
  // (the engine's own check names moe.experts).
  const std::string init_from = p.vm["model.init_from"].as<std::string>();
  MESHTRAIN_CONFIG_CHECK(init_from.empty() || !mc.moe.enabled() || mc.moe.experts % shape.ep == 0,
                         "mesh.ep=", shape.ep, " does not divide num_local_experts=",
                         mc.moe.experts, " of ", init_from, "/config.json (moe.experts)");
  // train.save exports a Mixture-of-Experts model as MixtralForCausalLM: refused before the
  // data is read and training starts, not after it, when the folder could not describe it.
  if (mc.moe.enabled() && p.vm["train.save"].as<bool>())
    io::check_mixtral_expressible(mc, "train.save=true; set train.save=false to keep the model "
                                      "in checkpoints only");
  train::TrainConfig tc;
  with_deepspeed_origin(ds, [&] { tc = train_config(p.vm, mc); });
  const std::string precision = p.vm["train.precision"].as<std::string>();
  const std::string out_dir = p.vm["train.out_dir"].as<std::string>();
  // NVTX and the CUDA profiler API come with the CUDA toolkit: a CPU build has neither.
  if (p.vm["profile.nvtx"].as<bool>()) {
    MESHTRAIN_CONFIG_CHECK(prof::nvtx_sink(), "profile.nvtx needs the CUDA build (NVTX comes "
                                              "with the CUDA toolkit)");
    prof::set_sink(prof::nvtx_sink());
  }
  if (tc.profile_first > 0)
    MESHTRAIN_CONFIG_CHECK(prof::install_cuda_profiler(), "profile.steps needs the CUDA build "
                                                          "(cudaProfilerStart/Stop)");
  kernels::AttentionOptions attn;
  attn.impl = kernels::parse_attention_impl(p.vm["attn.impl"].as<std::string>(), "attn.impl");
  attn.deterministic = p.vm["attn.deterministic"].as<bool>();
  // Whether libcudnn loads can differ between nodes: agreed, so every rank stops together.
  agree(rt.world(), "attn.impl=cudnn", [&] {
    if (attn.impl != kernels::AttentionImpl::cudnn) return;
    const std::string why = kernels::cudnn_attention_unavailable_reason();
    MESHTRAIN_CONFIG_CHECK(why.empty(), why, " (or run with --attn.impl auto / meshtrain)");
  });
  if (attn.impl != kernels::AttentionImpl::meshtrain && !kDeviceIsHost) {
    const std::string why = kernels::cudnn_attention_unavailable_reason();
    logging::info("attention: ", why.empty() ? "cuDNN fused flash attention for bf16/fp16 at "
                                                 "head size 64/128, meshtrain's kernels otherwise"
                                               : "meshtrain's kernels (" + why + ")",
                  attn.deterministic ? ", deterministic backward" : "");
  }
  tc.config_text = config::resolved_ini(p.vm, desc);
  set_fault_hooks();

  logging::info("meshtrain train: ", mc.describe());
  logging::info("resolved configuration:\n", tc.config_text);
  logging::info(kc::configuration_summary());

  parallel::EngineOptions eo = train::engine_options(tc, pc, p.vm["train.recompute"].as<bool>());
  eo.recompute_mlp_act = p.vm["train.recompute_mlp_act"].as<bool>();
  eo.head_chunk_tokens = p.vm["train.head_chunk_tokens"].as<int>();
  MESHTRAIN_CONFIG_CHECK(eo.head_chunk_tokens >= 0, "train.head_chunk_tokens=",
                         eo.head_chunk_tokens, " must be 0 (auto) or positive");
  eo.attention = attn;
  eo.fp8 = fp8_recipe(p.vm, mc);
  tc.fp8_flops_share = model::fp8_flops_share(mc, eo.fp8, tc.seq_len);
  // fp8 keeps bf16 parameters and activations where the build has bf16 on a GPU; host builds
  // keep fp32 ones (their FP8 GEMMs are the emulation either way). The planner counts the model
  // in that type (the FP8 casts' per-call temporaries are not counted).
  const std::string model_precision = app::model_precision(precision);
  if (eo.fp8.enabled)
    logging::info("fp8: the linears of blocks [", eo.fp8.first_last_bf16, ", ",
                  mc.n_layer - eo.fp8.first_last_bf16, ") in FP8 (",
                  kernels::fp8_scaling_name(eo.fp8.scaling), " current scaling, E4M3 forward, ",
                  "E5M2 gradients", eo.fp8.wgrad_bf16 ? ", weight gradients in bf16" : "",
                  mc.moe.enabled() && eo.fp8.experts ? "; MoE experts in FP8 (rowwise)" : "",
                  "); embedding, LM head, attention, norms",
                  mc.moe.enabled() ? (eo.fp8.experts ? ", MoE routers" : ", MoE routers and experts")
                                   : "",
                  " in ", model_precision,
                  kDeviceIsHost ? "; host build: the FP8 GEMMs are the exact fp32 emulation of "
                                  "cuBLASLt's FP8 matmul, slow (for tests, not for speed)"
                                : "");
  // Before anything large is allocated, agreed: the predicted memory of every rank fits.
  check_train_memory(rt, p.vm, mc, tc, eo, model_precision);

  const std::string tok_kind = p.vm["data.tokenizer"].as<std::string>();
  // Before step 1, agreed over the ranks: every rank's data and every place it writes.
  preflight_outputs(rt.world(), {out_dir, tc.metrics_file, tc.ckpt.dir});
  write_run_description(rt, out_dir, tc.config_text);
  const std::string blend = p.vm["data.blend"].as<std::string>();
  TrainData loaded;
  if (blend.empty()) {
    loaded = load_data(rt.world(), p.vm["data.train"].as<std::string>(),
                       p.vm["data.val"].as<std::string>(), tc.seq_len, mc.vocab_size);
  } else {
    // Each source brings its own validation shards: data.train and data.val name other data.
    MESHTRAIN_CONFIG_CHECK(p.vm["data.train"].defaulted(), "data.train and data.blend are both "
                           "given: data.blend names the training data (drop data.train)");
    const std::string val = p.vm["data.val"].as<std::string>();
    MESHTRAIN_CONFIG_CHECK(p.vm["data.val"].defaulted() || val.empty(), "data.val='", val,
                           "' cannot be combined with data.blend: each source is validated on "
                           "its own val shards (set data.val to \"\" to skip evaluation)");
    loaded = load_blend(rt.world(), io::parse_blend(blend, "data.blend"),
                        p.vm["data.val"].defaulted(), tc.seq_len, mc.vocab_size);
  }
  const io::BlendedDataset data = loaded.dataset();
  // Watches every communicator from here on (comm.timeout).
  const comm::Watchdog watchdog(watchdog_config(p.vm, out_dir, rt.world()));

  // SIGUSR1 / SIGTERM (Slurm's warning before the time limit, scancel, pre-emption) set a flag
  // that the trainer agrees on at the next step boundary: save, then exit with kExitRequeue.
  signals::install_stop_handlers();
  bool finished = true;
  if (model_precision == "fp32")
    finished = train_and_sample<float>(p.vm, mc, tc, data, out_dir, tok_kind,
                                       rt.world(), eo);
#if MESHTRAIN_HAVE_BF16
  else if (model_precision == "bf16")
    finished = train_and_sample<bf16>(p.vm, mc, tc, data, out_dir, tok_kind,
                                      rt.world(), eo);
  else
    finished = train_and_sample<fp16>(p.vm, mc, tc, data, out_dir, tok_kind,
                                      rt.world(), eo);
#endif
  if (!finished) {
    logging::info("exiting with status ", kExitRequeue, " (checkpoint saved after a stop signal; "
                  "requeue and pass --train.resume latest to continue)");
    return kExitRequeue;
  }
  return kExitOk;
}

po::options_description generate_options() {
  po::options_description d;
  d.add(config::generic_options());
  po::options_description g("Generation [generate]");
  g.add_options()
      ("generate.model", po::value<std::string>()->default_value("out/model"),
       "HuggingFace folder written by `meshtrain train` (or GPT-2 from HuggingFace)")
      ("generate.prompt", po::value<std::string>()->default_value("And God said"), "prompt text")
      ("generate.tokens", po::value<int>()->default_value(200), "tokens to generate")
      ("generate.temperature", po::value<double>()->default_value(0.8), "<= 0: greedy")
      ("generate.top_k", po::value<int>()->default_value(40), "sample from the k most likely")
      ("generate.seed", po::value<long long>()->default_value(42), "sampling seed")
      ("generate.dump", po::value<std::string>()->default_value(""),
       "also write a safetensors file with the prompt's token ids (prompt, I32), the logits of "
       "every prompt position (logits, F32 [n, vocab_size]) and prompt + continuation (tokens): "
       "what tests/reference/hf_llama_crosscheck.py compares with transformers")
      ("generate.tokenizer", po::value<std::string>()->default_value(""),
       "byte, gpt2 or hf; default: the one recorded in the model's config.json (hf: the "
       "folder's tokenizer.json unless data.vocab_json names one)")
      ("data.vocab_json", po::value<std::string>()->default_value(""), "GPT-2 BPE vocab.json")
      ("data.merges_txt", po::value<std::string>()->default_value(""), "GPT-2 BPE merges.txt");
  d.add(g).add(log_options());
  return d;
}

int cmd_generate(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = generate_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  const std::string dir = p.vm["generate.model"].as<std::string>();
  const model::GptConfig mc = io::read_hf_config(dir, 64);
  std::string kind = p.vm["generate.tokenizer"].as<std::string>();
  if (kind.empty()) kind = io::read_hf_tokenizer(dir);
  // An exported folder of an `hf` tokenizer holds its tokenizer.json.
  const std::string vocab = p.vm["data.vocab_json"].as<std::string>();
  auto tok = io::make_tokenizer(kind, vocab.empty() && kind == "hf" ? dir : vocab,
                                p.vm["data.merges_txt"].as<std::string>());
  model::Gpt m(mc, 1, mc.block_size);
  io::import_hf(m, dir);
  train::SampleConfig sc;
  sc.max_new_tokens = p.vm["generate.tokens"].as<int>();
  sc.temperature = static_cast<float>(p.vm["generate.temperature"].as<double>());
  sc.top_k = p.vm["generate.top_k"].as<int>();
  sc.seed = static_cast<std::uint64_t>(p.vm["generate.seed"].as<long long>());
  auto prompt = tok->encode(p.vm["generate.prompt"].as<std::string>());
  if (prompt.empty()) prompt.push_back(tok->eot() >= 0 ? tok->eot() : 0);
  const auto out = train::generate(m, prompt, sc);
  if (rt.rank() == 0) std::printf("%s\n", tok->decode(out).c_str());
  const std::string dump = p.vm["generate.dump"].as<std::string>();
  if (!dump.empty() && rt.rank() == 0) {
    const int n = static_cast<int>(prompt.size()), V = mc.vocab_size, Vp = mc.padded_vocab();
    MESHTRAIN_CONFIG_CHECK(n <= mc.block_size, "generate.dump: the prompt has ", n,
                           " tokens, more than model.block_size=", mc.block_size);
    auto input = alloc<std::int32_t>("generate.dump_input", static_cast<std::size_t>(mc.block_size));
    auto h = Kokkos::create_mirror_view(input);
    Kokkos::deep_copy(h, 0);
    std::copy(prompt.begin(), prompt.end(), h.data());
    Kokkos::deep_copy(input, h);
    auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.forward_logits(input));
    std::vector<float> l(static_cast<std::size_t>(n) * V);
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < V; ++c) l[std::size_t(r) * V + c] = logits(std::size_t(r) * Vp + c);
    io::SafetensorsWriter w;
    w.add_i32("prompt", {n}, prompt);
    w.add_f32("logits", {n, V}, std::move(l));
    w.add_i32("tokens", {static_cast<std::int64_t>(out.size())}, out);
    w.set_metadata("model", dir);
    w.write(dump);
  }
  return kExitOk;
}

}  // namespace meshtrain::app
