// `meshtrain train`: builds the model (a preset, overrides, or a HuggingFace checkpoint), trains
// it on token shards (saving and restoring parallel HDF5 checkpoints), evaluates, exports it in
// HuggingFace format and prints a sample. A stop signal saves a checkpoint and exits with 3.
#include "meshtrain/app/train_cmd.hpp"

#include <cstdlib>
#include <filesystem>
#include <type_traits>

#include "meshtrain/app/option_checks.hpp"
#include "meshtrain/app/options.hpp"
#include "meshtrain/app/preflight.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/kernels/attention.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_mixtral.hpp"
#include "meshtrain/io/safetensors.hpp"
#include "meshtrain/io/tokenizer.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/generate.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::app {

po::options_description model_options() {
  po::options_description d("Model [model]");
  d.add_options()
      ("model.preset", po::value<std::string>()->default_value("demo"),
       "gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, cpu-bench, demo, llama-tiny, llama-150m, "
       "llama3.2-1b, llama3.1-8b, llama3.1-70b")
      ("model.init_from", po::value<std::string>()->default_value(""),
       "HuggingFace folder (config.json + model.safetensors or shards; GPT-2, Llama, Qwen2, "
       "Mistral, Mixtral) to start from, each rank reading its slices; overrides preset")
      ("model.n_layer", po::value<int>(), "override the preset's layer count")
      ("model.n_head", po::value<int>(), "override the preset's head count")
      ("model.n_embd", po::value<int>(), "override the preset's width")
      ("model.vocab_size", po::value<int>(), "override the preset's vocabulary size")
      ("model.vocab_pad", po::value<int>(), "pad the vocabulary to a multiple of this")
      ("model.block_size", po::value<int>(), "override the preset's maximum sequence length")
      // The block description (config.hpp); each overrides the preset's.
      ("model.family", po::value<std::string>(), "gpt2 or llama: parameter names and layout")
      ("model.norm", po::value<std::string>(), "layernorm or rmsnorm")
      ("model.positions", po::value<std::string>(), "learned or rotary")
      ("model.mlp", po::value<std::string>(), "gelu or swiglu")
      ("model.n_kv_head", po::value<int>(), "key-value heads (grouped-query attention); 0: n_head")
      ("model.head_dim", po::value<int>(), "head size; 0: n_embd / n_head")
      ("model.intermediate_size", po::value<int>(), "MLP width; 0: 4 n_embd")
      ("model.bias", po::value<bool>(), "biases of the linears and norms")
      ("model.qkv_bias", po::value<bool>(), "llama family: biases on q, k and v only (Qwen2)")
      ("model.sliding_window", po::value<int>(),
       "Mistral's attention window; 0: none (meshtrain refuses sequences longer than a window)")
      ("model.tied_head", po::value<bool>(), "LM head shares the token embedding")
      ("model.norm_eps", po::value<double>(), "epsilon of the norms")
      ("model.rope_theta", po::value<double>(), "rotary base frequency")
      ("model.rope_scaling", po::value<std::string>(), "none or llama3 (Llama 3 frequency scaling)")
      ("model.rope_factor", po::value<double>(), "llama3 scaling: factor")
      ("model.rope_low_freq_factor", po::value<double>(), "llama3 scaling: low_freq_factor")
      ("model.rope_high_freq_factor", po::value<double>(), "llama3 scaling: high_freq_factor")
      ("model.rope_original_max_position", po::value<int>(),
       "llama3 scaling: original_max_position_embeddings");
  d.add(moe_options());
  return d;
}

po::options_description train_options() {
  po::options_description d;
  d.add(config::generic_options()).add(model_options());
  po::options_description data("Data [data]");
  data.add_options()
      ("data.train", po::value<std::string>()->default_value("inputs/data/kjv_train_*.bin"),
       "training shards (file or glob), llm.c format")
      ("data.val", po::value<std::string>()->default_value("inputs/data/kjv_val_*.bin"),
       "validation shards; empty: no evaluation")
      ("data.blend", po::value<std::string>()->default_value(""),
       "train on weighted sources instead of data.train: \"0.7 data/web 0.2 data/code 0.1 "
       "data/books\" (weights normalised). A source is a shard prefix P (P_train_*.bin, "
       "validated on P_val_*.bin; P may hold glob characters) or a shard glob ending in .bin. "
       "Each global batch draws from the sources by a function of seed and step; tokens per "
       "source go to the metrics and checkpoints, validation losses per source to the eval "
       "lines. data.val \"\" skips evaluation")
      ("data.tokenizer", po::value<std::string>()->default_value("byte"),
       "byte or gpt2 (decodes samples; gpt2 needs data.vocab_json and data.merges_txt)")
      ("data.vocab_json", po::value<std::string>()->default_value(""), "GPT-2 BPE vocab.json")
      ("data.merges_txt", po::value<std::string>()->default_value(""), "GPT-2 BPE merges.txt");
  po::options_description t("Training [train]");
  t.add_options()
      ("train.micro_batch", po::value<int>()->default_value(8), "sequences per micro-batch")
      ("train.grad_accum", po::value<int>()->default_value(1), "micro-batches per step")
      ("train.seq_len", po::value<int>()->default_value(0), "tokens per sequence; 0 = block_size")
      ("train.steps", po::value<long long>()->default_value(200), "optimizer steps")
      ("train.lr", po::value<double>()->default_value(1e-3), "peak learning rate")
      ("train.min_lr", po::value<double>()->default_value(1e-4), "learning rate at the end of decay")
      ("train.warmup", po::value<int>()->default_value(20), "linear warmup steps")
      ("train.decay_steps", po::value<long long>()->default_value(0),
       "cosine decay ends here; 0 = train.steps")
      ("train.weight_decay", po::value<double>()->default_value(0.1), "AdamW weight decay")
      ("train.beta1", po::value<double>()->default_value(0.9), "AdamW beta1")
      ("train.beta2", po::value<double>()->default_value(0.95), "AdamW beta2")
      ("train.eps", po::value<double>()->default_value(1e-8), "AdamW epsilon")
      ("train.grad_clip", po::value<double>()->default_value(1.0), "max gradient norm; 0 = off")
      ("train.seed", po::value<long long>()->default_value(1337), "initialisation and data order")
      ("train.eval_every", po::value<int>()->default_value(100), "evaluate every N steps; 0 = end only")
      ("train.eval_batches", po::value<int>()->default_value(8), "validation micro-batches")
      ("train.log_every", po::value<int>()->default_value(1), "progress line every N steps")
      ("train.precision", po::value<std::string>()->default_value("fp32"),
       "fp32, or bf16 / fp16 (GPU builds: 16-bit parameters, activations and gradients with "
       "fp32 accumulation, fp32 master weights and optimizer state)")
      ("train.loss_scaling", po::value<std::string>()->default_value("auto"),
       "dynamic loss scaling: auto (on for fp16), on, off")
      ("train.loss_scale_init", po::value<double>()->default_value(65536.0),
       "initial loss scale (a power of two)")
      ("train.loss_scale_window", po::value<int>()->default_value(1000),
       "double the loss scale after this many steps without inf/nan")
      ("train.on_nonfinite", po::value<std::string>()->default_value("stop"),
       "a step with a non-finite loss or gradients: stop (exit 1, nothing saved from it), skip "
       "(its update), or rollback (to the last checkpoint, leaving its batch out)")
      ("train.max_rollbacks", po::value<int>()->default_value(3),
       "train.on_nonfinite=rollback: at most this many rollbacks, then stop")
      ("train.max_skipped_steps", po::value<int>()->default_value(50),
       "stop after this many consecutive steps without an update (inf/nan gradients under loss "
       "scaling, or train.on_nonfinite=skip)")
      ("train.recompute", po::value<bool>()->default_value(false)->implicit_value(true),
       "activation checkpointing: recompute each block's forward in backward")
      ("train.recompute_mlp_act",
       po::value<bool>()->default_value(false)->implicit_value(true),
       "keep only each dense MLP's pre-activation; its GELU / SwiGLU output is one shared buffer, "
       "recomputed in backward (saves micro_batch x seq_len x MLP width / tp elements per block, "
       "costs one elementwise pass; no effect with train.recompute)")
      ("train.head_chunk_tokens", po::value<int>()->default_value(0),
       "tokens of the LM head and loss computed at once: only that many rows of logits "
       "(x vocab / tp) are held; 0 = auto (the whole micro-batch if its logits fit in 256 MiB, "
       "else the fewest equal chunks that do)")
      ("train.peak_tflops", po::value<double>()->default_value(kDeviceIsHost ? 0.0 : 989.0),
       "peak FLOP/s of one device for MFU (H100/H200 bf16 dense: 989); 0 = no MFU")
      ("train.out_dir", po::value<std::string>()->default_value("out"),
       "folder for the trained model (HuggingFace format) and metrics")
      ("train.metrics", po::value<std::string>()->default_value(""),
       "JSON-lines metrics file; default <out_dir>/metrics.jsonl")
      ("train.save", po::value<bool>()->default_value(true)->implicit_value(true),
       "export the trained model to <out_dir>/model (a HuggingFace folder: GPT2LMHeadModel, "
       "LlamaForCausalLM, or MixtralForCausalLM for a Llama with moe.experts; streamed tensor "
       "by tensor to rank 0)")
      ("train.save_dtype", po::value<std::string>()->default_value("f32"),
       "dtype of the exported tensors: f32 (the parameters as they are) or bf16")
      ("train.save_max_shard_mb", po::value<double>()->default_value(5000.0),
       "largest safetensors shard of the export in MB (10^6 bytes; save_pretrained's "
       "max_shard_size); more than one shard adds model.safetensors.index.json")
      ("train.sample_tokens", po::value<int>()->default_value(200),
       "after training, print a sample of this many tokens; 0 = none")
      ("train.sample_prompt", po::value<std::string>()->default_value("And God said"),
       "prompt of the sample")
      ("train.sample_temperature", po::value<double>()->default_value(0.8), "sampling temperature")
      ("train.sample_top_k", po::value<int>()->default_value(40), "sample from the k most likely")
      ("train.resume", po::value<std::string>()->default_value(""),
       "continue a run from a checkpoint: latest (<ckpt.dir>/latest), a step_XXXXXXXX.h5 file or "
       "a checkpoint folder; any layout restores any other; empty = start fresh");
  po::options_description c("Checkpoints [ckpt]");
  c.add_options()
      ("ckpt.dir", po::value<std::string>()->default_value(""),
       "folder of the checkpoints (step_XXXXXXXX.h5 and `latest`); default <train.out_dir>/"
       "checkpoints")
      ("ckpt.every", po::value<long long>()->default_value(0),
       "save after every N steps; 0 = only on SIGUSR1/SIGTERM (then exit 3) and at the end "
       "(ckpt.final)")
      ("ckpt.final", po::value<bool>()->default_value(true)->implicit_value(true),
       "save a checkpoint after the last step")
      ("ckpt.keep", po::value<int>()->default_value(0),
       "keep only the N newest checkpoints; 0 = keep all")
      ("ckpt.io", po::value<std::string>()->default_value("automatic"),
       "MPI-IO data transfer: automatic (independent where each rank's part of a tensor is one "
       "run of the file, collective otherwise), collective or independent")
      ("ckpt.verify", po::value<bool>()->default_value(true)->implicit_value(true),
       "verify the per-tensor checksums when restoring");
  po::options_description a("Attention [attn]");
  a.add_options()
      ("attn.impl", po::value<std::string>()->default_value("auto"),
       "attention backend on a GPU: auto (cuDNN's fused flash attention where libcudnn.so.9 "
       "loads and the call suits it: bf16/fp16, head size 64 or 128; else meshtrain's), cudnn "
       "(the same, but no cuDNN is an error) or meshtrain (always ours)")
      ("attn.deterministic", po::value<bool>()->default_value(false)->implicit_value(true),
       "cuDNN's deterministic attention backward (bitwise repeatable, slower); meshtrain's "
       "kernels are deterministic either way");
  d.add(data).add(t).add(c).add(a).add(mesh_options()).add(parallel_options())
      .add(comm_options()).add(watchdog_options()).add(log_options());
  return d;
}

model::GptConfig model_config(const po::variables_map& vm) {
  const std::string init = vm["model.init_from"].as<std::string>();
  const int pad = vm.count("model.vocab_pad") ? vm["model.vocab_pad"].as<int>() : 64;
  model::GptConfig c = init.empty() ? model::preset(vm["model.preset"].as<std::string>())
                                    : io::read_hf_config(init, pad);
  auto set = [&](const char* key) {
    if (!vm.count(key)) return false;
    MESHTRAIN_CONFIG_CHECK(init.empty(), key, " cannot override model.init_from's config.json");
    return true;
  };
  auto over = [&](const char* key, auto& field) {
    if (set(key)) field = vm[key].as<std::remove_reference_t<decltype(field)>>();
  };
  auto over_enum = [&](const char* key, auto& field, auto parse) {
    if (set(key)) field = parse(vm[key].as<std::string>(), key);
  };
  over_enum("model.family", c.family, model::parse_family);
  over_enum("model.norm", c.norm, model::parse_norm);
  over_enum("model.positions", c.positions, model::parse_positions);
  over_enum("model.mlp", c.mlp, model::parse_mlp);
  over("model.n_kv_head", c.n_kv_head);
  over("model.head_dim", c.head_dim);
  over("model.intermediate_size", c.intermediate_size);
  over("model.bias", c.bias);
  over("model.qkv_bias", c.qkv_bias);
  over("model.sliding_window", c.sliding_window);
  over("model.tied_head", c.tied_head);
  over("model.norm_eps", c.norm_eps);
  over("model.rope_theta", c.rope.theta);
  if (set("model.rope_scaling")) {
    const std::string s = vm["model.rope_scaling"].as<std::string>();
    MESHTRAIN_CONFIG_CHECK(s == "none" || s == "llama3", "model.rope_scaling='", s,
                           "' is not one of none, llama3");
    c.rope.llama3_scaling = s == "llama3";
  }
  over("model.rope_factor", c.rope.factor);
  over("model.rope_low_freq_factor", c.rope.low_freq_factor);
  over("model.rope_high_freq_factor", c.rope.high_freq_factor);
  over("model.rope_original_max_position", c.rope.original_max_position_embeddings);
  over("model.n_layer", c.n_layer);
  over("model.n_head", c.n_head);
  over("model.n_embd", c.n_embd);
  over("model.vocab_size", c.vocab_size);
  over("model.block_size", c.block_size);
  if (vm.count("model.vocab_pad")) c.vocab_pad = pad;
  apply_moe_options(vm, c);
  c.validate();
  return c;
}

namespace {

std::unique_ptr<io::Tokenizer> tokenizer_from(const po::variables_map& vm, const std::string& kind) {
  return io::make_tokenizer(kind, vm["data.vocab_json"].as<std::string>(),
                            vm["data.merges_txt"].as<std::string>());
}

// Fault injection for tests/cli (MESHTRAIN_TEST_*; see core/fault_injection.hpp). An unset variable
// leaves the hook off; a malformed one is a configuration error, not a silent no-op.
std::int64_t env_step(const char* name, const char* prefix = "") {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  const std::string text = v, pre = prefix;
  MESHTRAIN_CONFIG_CHECK(text.rfind(pre, 0) == 0 && text.size() > pre.size() &&
                             text.find_first_not_of("0123456789", pre.size()) == std::string::npos,
                         name, "='", text, "' is not of the form ", pre, "<step>");
  return std::stoll(text.substr(pre.size()));
}

void set_fault_hooks() {
  fault::Hooks& h = fault::hooks();
  h.crash_at_checkpoint = env_step("MESHTRAIN_TEST_CRASH_AT", "checkpoint:");
  h.signal_at_step = env_step("MESHTRAIN_TEST_SIGNAL_AT_STEP");
  if (const char* r = std::getenv("MESHTRAIN_TEST_SIGNAL_RANK")) h.signal_rank = std::atoi(r);
  h.wait_signal_at_step = env_step("MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP");
  if (const char* v = std::getenv("MESHTRAIN_TEST_HOLD_AFTER_STOP")) h.hold_after_stop = *v == '1';
  h.nan_batch = nan_batch_from_env();
  h.throw_at_step = env_step("MESHTRAIN_TEST_THROW_AT_STEP");
  if (const char* r = std::getenv("MESHTRAIN_TEST_THROW_RANK")) h.throw_rank = std::atoi(r);
  collective_fault_from_env();
}

io::Transfer parse_transfer(const std::string& s) {
  if (s == "automatic") return io::Transfer::automatic;
  if (s == "collective") return io::Transfer::collective;
  if (s == "independent") return io::Transfer::independent;
  throw ConfigError(cat("ckpt.io='", s, "' is not one of automatic, collective, independent"));
}

}  // namespace

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
  return c;
}

int cmd_train(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = train_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  check_train_options(p.vm);
  const mesh::Shape shape = mesh_shape(p.vm, rt.size());
  const parallel::ParallelConfig pc = parallel_config(p.vm, shape);
  const model::GptConfig mc = model_config(p.vm);
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
  const std::string precision = p.vm["train.precision"].as<std::string>();
  const std::string scaling = p.vm["train.loss_scaling"].as<std::string>();
  MESHTRAIN_CONFIG_CHECK(scaling == "auto" || scaling == "on" || scaling == "off",
                         "train.loss_scaling='", scaling, "' is not one of auto, on, off");
  tc.loss_scaling = scaling == "on" || (scaling == "auto" && precision == "fp16");
  tc.loss_scale_init = static_cast<float>(p.vm["train.loss_scale_init"].as<double>());
  tc.loss_scale_window = p.vm["train.loss_scale_window"].as<int>();
  MESHTRAIN_CONFIG_CHECK(precision == "fp32" || precision == "bf16" || precision == "fp16",
                         "train.precision='", precision, "' is not one of fp32, bf16, fp16");
  // 16-bit training exists where Kokkos has the types (Kokkos 4) and runs on GPUs only: the CPU
  // build trains in fp32.
  MESHTRAIN_CONFIG_CHECK(precision == "fp32" || (MESHTRAIN_HAVE_BF16 && !kDeviceIsHost),
                         "train.precision=", precision,
                         " needs a GPU build (Kokkos 4 with CUDA); the CPU build trains in fp32");
  tc.micro_batch = p.vm["train.micro_batch"].as<int>();
  tc.grad_accum = p.vm["train.grad_accum"].as<int>();
  tc.seq_len = p.vm["train.seq_len"].as<int>();
  if (tc.seq_len == 0) tc.seq_len = mc.block_size;
  tc.steps = p.vm["train.steps"].as<long long>();
  MESHTRAIN_CONFIG_CHECK(tc.steps > 0, "train.steps=", tc.steps, " must be positive");
  tc.seed = static_cast<std::uint64_t>(p.vm["train.seed"].as<long long>());
  tc.eval_every = p.vm["train.eval_every"].as<int>();
  tc.eval_batches = p.vm["train.eval_batches"].as<int>();
  tc.log_every = p.vm["train.log_every"].as<int>();
  tc.peak_tflops = p.vm["train.peak_tflops"].as<double>();
  auto& a = tc.adamw;
  a.lr = static_cast<float>(p.vm["train.lr"].as<double>());
  a.min_lr = static_cast<float>(p.vm["train.min_lr"].as<double>());
  a.warmup_steps = p.vm["train.warmup"].as<int>();
  a.decay_steps = p.vm["train.decay_steps"].as<long long>();
  if (a.decay_steps == 0) a.decay_steps = tc.steps;
  a.weight_decay = static_cast<float>(p.vm["train.weight_decay"].as<double>());
  a.beta1 = static_cast<float>(p.vm["train.beta1"].as<double>());
  a.beta2 = static_cast<float>(p.vm["train.beta2"].as<double>());
  a.eps = static_cast<float>(p.vm["train.eps"].as<double>());
  a.grad_clip = static_cast<float>(p.vm["train.grad_clip"].as<double>());
  const std::string out_dir = p.vm["train.out_dir"].as<std::string>();
  tc.metrics_file = p.vm["train.metrics"].as<std::string>();
  if (tc.metrics_file.empty()) tc.metrics_file = out_dir + "/metrics.jsonl";
  tc.ckpt.dir = p.vm["ckpt.dir"].as<std::string>();
  if (tc.ckpt.dir.empty()) tc.ckpt.dir = out_dir + "/checkpoints";
  tc.ckpt.every = p.vm["ckpt.every"].as<long long>();
  MESHTRAIN_CONFIG_CHECK(tc.ckpt.every >= 0, "ckpt.every=", tc.ckpt.every,
                         " must be 0 (no periodic saves) or positive");
  tc.ckpt.final = p.vm["ckpt.final"].as<bool>();
  tc.ckpt.keep = p.vm["ckpt.keep"].as<int>();
  MESHTRAIN_CONFIG_CHECK(tc.ckpt.keep >= 0, "ckpt.keep=", tc.ckpt.keep,
                         " must be 0 (keep all) or positive");
  tc.ckpt.transfer = parse_transfer(p.vm["ckpt.io"].as<std::string>());
  tc.ckpt.verify = p.vm["ckpt.verify"].as<bool>();
  tc.divergence.on_nonfinite = train::parse_on_nonfinite(p.vm["train.on_nonfinite"].as<std::string>());
  tc.divergence.max_rollbacks = p.vm["train.max_rollbacks"].as<int>();
  tc.divergence.max_skipped_steps = p.vm["train.max_skipped_steps"].as<int>();
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

  const std::string tok_kind = p.vm["data.tokenizer"].as<std::string>();
  // Before step 1, agreed over the ranks: every rank's data and every place it writes.
  preflight_outputs(rt.world(), {out_dir, tc.metrics_file, tc.ckpt.dir});
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
  const comm::Watchdog watchdog(watchdog_config(p.vm, out_dir, rt.rank()));

  // SIGUSR1 / SIGTERM (Slurm's warning before the time limit, scancel, pre-emption) set a flag
  // that the trainer agrees on at the next step boundary: save, then exit with kExitRequeue.
  signals::install_stop_handlers();
  parallel::EngineOptions eo = train::engine_options(tc, pc, p.vm["train.recompute"].as<bool>());
  eo.recompute_mlp_act = p.vm["train.recompute_mlp_act"].as<bool>();
  eo.head_chunk_tokens = p.vm["train.head_chunk_tokens"].as<int>();
  MESHTRAIN_CONFIG_CHECK(eo.head_chunk_tokens >= 0, "train.head_chunk_tokens=",
                         eo.head_chunk_tokens, " must be 0 (auto) or positive");
  eo.attention = attn;
  bool finished = true;
  if (precision == "fp32")
    finished = train_and_sample<float>(p.vm, mc, tc, data, out_dir, tok_kind,
                                       rt.world(), eo);
#if MESHTRAIN_HAVE_BF16
  else if (precision == "bf16")
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
