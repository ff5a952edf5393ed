// The options of `meshtrain train` (and of the subcommands that take the model's: plan, bench,
// config, doctor) and the model configuration they describe.
#include <algorithm>
#include <type_traits>

#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/app/options.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/mpi_threads.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/core/profile.hpp"

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

po::options_description fp8_options() {
  po::options_description f("FP8 [fp8] (train.precision=fp8; plan.precision=fp8)");
  f.add_options()
      ("fp8.recipe", po::value<std::string>()->default_value("tensorwise"),
       "how each FP8 cast is scaled from the amax of the tensor cast: tensorwise (one scale per "
       "tensor, TorchTitan's and TransformerEngine's default) or rowwise (one scale per row of "
       "every GEMM operand along the GEMM's K dimension, torchao's rowwise recipe: an outlier "
       "spoils only its row)")
      ("fp8.first_last_bf16", po::value<int>()->default_value(0),
       "keep the linears of the first N and the last N transformer blocks in bf16 (Megatron's "
       "--first-last-layers-bf16, for runs whose loss spikes); 0: every block in FP8, the "
       "default of TorchTitan and TransformerEngine (the embedding and LM head are never FP8)")
      ("fp8.wgrad_bf16", po::value<bool>()->default_value(false)->implicit_value(true),
       "run the weight-gradient GEMMs in bf16 (FP8 only for the forward and input-gradient "
       "GEMMs)")
      ("fp8.experts", po::value<bool>()->default_value(false)->implicit_value(true),
       "also run the MoE experts' (and shared expert's) forward and input-gradient GEMMs in "
       "FP8, rowwise per token (weight gradients in bf16); off by default: on one H100 it made "
       "the step slower (0.59x at llama-150m with 8 experts, 0.82x at 8B width), its rowwise "
       "casts not yet being CUDA kernels (see docs/DESIGN.md)");
  return f;
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
      ("train.lr_schedule", po::value<std::string>()->default_value("cosine"),
       "cosine (linear warmup, cosine to min_lr at decay_steps), constant, or DeepSpeed's: "
       "ds_warmup (WarmupLR: warmup_min_lr -> lr, then lr), ds_warmup_decay (WarmupDecayLR: then "
       "linear to warmup_min_lr at decay_steps), ds_warmup_cosine (WarmupCosineLR: then cosine to "
       "min_lr at decay_steps); the ds_* shapes step as DeepSpeed's engine does")
      ("train.warmup_type", po::value<std::string>()->default_value("linear"),
       "ds_* schedules: linear or log warmup (DeepSpeed's warmup_type)")
      ("train.warmup_min_lr", po::value<double>()->default_value(0.0),
       "ds_* schedules: the learning rate warmup starts from")
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
       "fp32 accumulation, fp32 master weights and optimizer state), or fp8 (as bf16, with the "
       "transformer blocks' linear layers in FP8: E4M3 activations and weights, E5M2 gradients, "
       "current scaling, see [fp8]; host builds run the exact but slow fp32 emulation of the "
       "FP8 GEMMs with fp32 activations)")
      ("train.loss_scaling", po::value<std::string>()->default_value("auto"),
       "dynamic loss scaling: auto (on for fp16), on, off, or static (train.loss_scale_init "
       "throughout; steps with inf/nan gradients are still skipped)")
      ("train.loss_scale_init", po::value<double>()->default_value(65536.0),
       "initial loss scale (a power of two)")
      ("train.loss_scale_window", po::value<int>()->default_value(1000),
       "double the loss scale after this many steps without inf/nan")
      ("train.loss_scale_min", po::value<double>()->default_value(1.0),
       "the loss scale never halves below this")
      ("train.loss_scale_hysteresis", po::value<int>()->default_value(1),
       "halve the loss scale at the N-th overflow only (DeepSpeed's hysteresis; refilled when "
       "the scale doubles)")
      ("train.loss_scale_consecutive_hysteresis",
       po::value<bool>()->default_value(false)->implicit_value(true),
       "refill the hysteresis after every step without inf/nan (DeepSpeed's)")
      ("train.on_nonfinite", po::value<std::string>()->default_value("stop"),
       "a step with a non-finite loss or gradients: stop (exit 1, nothing saved from it), skip "
       "(its update), or rollback (to the last checkpoint, leaving its batch out)")
      ("train.max_rollbacks", po::value<int>()->default_value(3),
       "train.on_nonfinite=rollback: at most this many rollbacks, then stop")
      ("train.max_skipped_steps", po::value<int>()->default_value(50),
       "stop after this many consecutive steps without an update (inf/nan gradients under loss "
       "scaling, or train.on_nonfinite=skip)")
      ("train.memory_check", po::value<std::string>()->default_value("error"),
       "before allocating, compare each rank's predicted memory (the planner's model of this "
       "layout) with what it has (GPU: free device memory; CPU: the node's MemAvailable / its "
       "ranks): error (exit 2 with the numbers and what would fit), warn (say so, start "
       "anyway) or off")
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
      ("train.tensorboard", po::value<std::string>()->default_value(""),
       "folder for TensorBoard event files (world rank 0: loss, lr, grad norm, tokens/s, MFU, "
       "memory, eval loss, communication shares); empty = none")
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
       "verify the per-tensor checksums when restoring")
      ("ckpt.async", po::value<bool>()->default_value(true)->implicit_value(true),
       "asynchronous saves: each rank copies its part of the state into host staging buffers "
       "(pinned on GPU builds) and training continues while a background thread writes and "
       "commits the file; needs MPI_THREAD_MULTIPLE (otherwise saves stay synchronous, with a "
       "warning); false: every save blocks training until it is committed");
  po::options_description a("Attention [attn]");
  a.add_options()
      ("attn.impl", po::value<std::string>()->default_value("auto"),
       "attention backend on a GPU: auto (cuDNN's fused flash attention where libcudnn.so.9 "
       "loads and the call suits it: bf16/fp16, head size 64 or 128; else meshtrain's), cudnn "
       "(the same, but no cuDNN is an error) or meshtrain (always ours)")
      ("attn.deterministic", po::value<bool>()->default_value(false)->implicit_value(true),
       "cuDNN's deterministic attention backward (bitwise repeatable, slower); meshtrain's "
       "kernels are deterministic either way");
  d.add(data).add(t).add(fp8_options()).add(c).add(a).add(mesh_options()).add(parallel_options())
      .add(comm_options()).add(watchdog_options()).add(profile_options()).add(log_options())
      .add(deepspeed_options());
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

std::string model_precision(const std::string& precision) {
  if (precision != "fp8") return precision;
  return MESHTRAIN_HAVE_BF16 && !kDeviceIsHost ? "bf16" : "fp32";
}

model::Fp8Recipe fp8_recipe(const po::variables_map& vm, const model::GptConfig& mc,
                            const char* precision_option) {
  const std::string precision = vm[precision_option].as<std::string>();
  model::Fp8Recipe r;
  r.enabled = precision == "fp8";
  for (const char* name : {"fp8.recipe", "fp8.first_last_bf16", "fp8.wgrad_bf16", "fp8.experts"})
    MESHTRAIN_CONFIG_CHECK(r.enabled || vm[name].defaulted(), name, " needs ", precision_option,
                           "=fp8 (it is ", precision.empty() ? std::string("unset") : precision, ")");
  r.scaling = model::parse_fp8_recipe(vm["fp8.recipe"].as<std::string>(), "fp8.recipe");
  r.first_last_bf16 = vm["fp8.first_last_bf16"].as<int>();
  r.wgrad_bf16 = vm["fp8.wgrad_bf16"].as<bool>();
  r.experts = vm["fp8.experts"].as<bool>();
  MESHTRAIN_CONFIG_CHECK(r.first_last_bf16 >= 0, "fp8.first_last_bf16=", r.first_last_bf16,
                         " must be >= 0");
  MESHTRAIN_CONFIG_CHECK(!r.enabled || 2 * r.first_last_bf16 < mc.n_layer,
                         "fp8.first_last_bf16=", r.first_last_bf16, " keeps all model.n_layer=",
                         mc.n_layer, " blocks in bf16: no linear would run in FP8");
  return r;
}

io::Transfer parse_transfer(const std::string& s) {
  if (s == "automatic") return io::Transfer::automatic;
  if (s == "collective") return io::Transfer::collective;
  if (s == "independent") return io::Transfer::independent;
  throw ConfigError(cat("ckpt.io='", s, "' is not one of automatic, collective, independent"));
}

train::TrainConfig train_config(const po::variables_map& vm, const model::GptConfig& mc) {
  train::TrainConfig tc;
  const std::string precision = vm["train.precision"].as<std::string>();
  const std::string scaling = vm["train.loss_scaling"].as<std::string>();
  MESHTRAIN_CONFIG_CHECK(scaling == "auto" || scaling == "on" || scaling == "off" ||
                             scaling == "static",
                         "train.loss_scaling='", scaling, "' is not one of auto, on, off, static");
  tc.loss_scaling =
      scaling == "on" || scaling == "static" || (scaling == "auto" && precision == "fp16");
  tc.loss_scale_static = scaling == "static";
  tc.loss_scale_init = static_cast<float>(vm["train.loss_scale_init"].as<double>());
  tc.loss_scale_window = vm["train.loss_scale_window"].as<int>();
  tc.loss_scale_min = static_cast<float>(vm["train.loss_scale_min"].as<double>());
  tc.loss_scale_hysteresis = vm["train.loss_scale_hysteresis"].as<int>();
  tc.loss_scale_consecutive_hysteresis = vm["train.loss_scale_consecutive_hysteresis"].as<bool>();
  MESHTRAIN_CONFIG_CHECK(precision == "fp32" || precision == "bf16" || precision == "fp16" ||
                             precision == "fp8",
                         "train.precision='", precision, "' is not one of fp32, bf16, fp16, fp8");
  // 16-bit training exists where Kokkos has the types (Kokkos 4) and runs on GPUs only: the CPU
  // build trains in fp32. fp8 runs everywhere: on host builds, FP8 GEMMs emulated with fp32
  // activations.
  MESHTRAIN_CONFIG_CHECK(precision == "fp32" || precision == "fp8" ||
                             (MESHTRAIN_HAVE_BF16 && !kDeviceIsHost),
                         "train.precision=", precision,
                         " needs a GPU build (Kokkos 4 with CUDA); the CPU build trains in fp32");
  tc.micro_batch = vm["train.micro_batch"].as<int>();
  tc.grad_accum = vm["train.grad_accum"].as<int>();
  tc.seq_len = vm["train.seq_len"].as<int>();
  if (tc.seq_len == 0) tc.seq_len = mc.block_size;
  tc.steps = vm["train.steps"].as<long long>();
  MESHTRAIN_CONFIG_CHECK(tc.steps > 0, "train.steps=", tc.steps, " must be positive");
  tc.seed = static_cast<std::uint64_t>(vm["train.seed"].as<long long>());
  tc.eval_every = vm["train.eval_every"].as<int>();
  tc.eval_batches = vm["train.eval_batches"].as<int>();
  tc.log_every = vm["train.log_every"].as<int>();
  tc.peak_tflops = vm["train.peak_tflops"].as<double>();
  auto& a = tc.adamw;
  a.lr = static_cast<float>(vm["train.lr"].as<double>());
  a.min_lr = static_cast<float>(vm["train.min_lr"].as<double>());
  a.warmup_steps = vm["train.warmup"].as<int>();
  a.decay_steps = vm["train.decay_steps"].as<long long>();
  if (a.decay_steps == 0) a.decay_steps = tc.steps;
  a.weight_decay = static_cast<float>(vm["train.weight_decay"].as<double>());
  a.beta1 = static_cast<float>(vm["train.beta1"].as<double>());
  a.beta2 = static_cast<float>(vm["train.beta2"].as<double>());
  a.eps = static_cast<float>(vm["train.eps"].as<double>());
  a.grad_clip = static_cast<float>(vm["train.grad_clip"].as<double>());
  a.schedule = optim::parse_lr_schedule(vm["train.lr_schedule"].as<std::string>());
  a.warmup_type = optim::parse_warmup_type(vm["train.warmup_type"].as<std::string>());
  a.warmup_min_lr = static_cast<float>(vm["train.warmup_min_lr"].as<double>());
  // WarmupCosineLR divides by the steps between warmup and the end of decay.
  if (a.schedule == optim::LrSchedule::ds_warmup_cosine)
    MESHTRAIN_CONFIG_CHECK(a.decay_steps > std::max(2, a.warmup_steps), "train.decay_steps=",
                           a.decay_steps, " must be larger than train.warmup=", a.warmup_steps,
                           " (at least 2) for train.lr_schedule=ds_warmup_cosine (DeepSpeed's "
                           "WarmupCosineLR decays over the steps between them)");
  const std::string out_dir = vm["train.out_dir"].as<std::string>();
  tc.tensorboard_dir = vm["train.tensorboard"].as<std::string>();
  tc.memory_file = out_dir + "/memory.json";
  const prof::StepRange capture =
      prof::parse_step_range(vm["profile.steps"].as<std::string>(), "profile.steps");
  tc.profile_first = capture.first;
  tc.profile_last = capture.last;
  tc.metrics_file = vm["train.metrics"].as<std::string>();
  if (tc.metrics_file.empty()) tc.metrics_file = out_dir + "/metrics.jsonl";
  tc.ckpt.dir = vm["ckpt.dir"].as<std::string>();
  if (tc.ckpt.dir.empty()) tc.ckpt.dir = out_dir + "/checkpoints";
  tc.ckpt.every = vm["ckpt.every"].as<long long>();
  MESHTRAIN_CONFIG_CHECK(tc.ckpt.every >= 0, "ckpt.every=", tc.ckpt.every,
                         " must be 0 (no periodic saves) or positive");
  tc.ckpt.final = vm["ckpt.final"].as<bool>();
  tc.ckpt.keep = vm["ckpt.keep"].as<int>();
  MESHTRAIN_CONFIG_CHECK(tc.ckpt.keep >= 0, "ckpt.keep=", tc.ckpt.keep,
                         " must be 0 (keep all) or positive");
  tc.ckpt.transfer = parse_transfer(vm["ckpt.io"].as<std::string>());
  tc.ckpt.verify = vm["ckpt.verify"].as<bool>();
  tc.ckpt.async_write = vm["ckpt.async"].as<bool>();
  if (tc.ckpt.async_write && !mpi_thread_multiple()) {
    int level = 0;
    MPI_Query_thread(&level);
    logging::warn("ckpt.async=true needs MPI_THREAD_MULTIPLE and this MPI provides ",
                  thread_level_name(level), ": checkpoints are written synchronously");
    tc.ckpt.async_write = false;
  }
  tc.divergence.on_nonfinite = train::parse_on_nonfinite(vm["train.on_nonfinite"].as<std::string>());
  tc.divergence.max_rollbacks = vm["train.max_rollbacks"].as<int>();
  tc.divergence.max_skipped_steps = vm["train.max_skipped_steps"].as<int>();
  return tc;
}

}  // namespace meshtrain::app
