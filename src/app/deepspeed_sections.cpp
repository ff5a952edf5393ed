// DeepSpeed's precision, ZeRO, activation checkpointing and tensorboard sections, and the keys
// meshtrain has no use for (app/deepspeed_config.hpp; the batch, optimizer and scheduler
// sections are deepspeed_config.cpp's).
#include <cmath>

#include "deepspeed_mapper.hpp"

namespace meshtrain::app::ds {

// Keys DeepSpeed knows that change nothing meshtrain computes or that it has no counterpart for
// (monitoring, its own kernels and memory tricks, features of its engine).
const std::set<std::string> kNoEffectTop = {
    "wall_clock_breakdown", "memory_breakdown", "flops_profiler", "dump_state",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
    "communication_data_type", "seq_parallel_communication_data_type",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "elasticity", "autotuning",
    "compile", "aio", "checkpoint", "data_efficiency", "curriculum_learning", "pipeline",
    "compression_training", "nebula", "data_types", "wandb", "csv_monitor", "comet",
    "comms_logger", "timers", "graph_harvesting", "use_data_before_expert_parallelism",
    "disable_allgather", "vocabulary_size", "eigenvalue", "progressive_layer_drop",
    "sparse_attention", "hybrid_engine", "weight_quantization", "quantize_training",
    "torch_autocast", "fp8", "monitor_config", "zero_quantized_weights",
    "zero_quantized_gradients", "gradient_accumulation_dtype", "dataloader_drop_last"};
const std::set<std::string> kZeroNoEffect = {
    "round_robin_gradients", "elastic_checkpoint", "sub_group_size", "load_from_fp32_weights",
    "ignore_unused_parameters", "legacy_stage1", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "mics_shard_size",
    "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "log_trace_cache_warnings", "zeropp_loco_param",
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
    "max_live_parameters", "max_reuse_distance", "stage3_use_all_reduce_for_fetch_params",
    "stage3_module_granularity_threshold", "cpu_offload_params", "cpu_offload_use_pin_memory"};
const std::set<std::string> kOffloadNoEffect = {"pin_memory", "buffer_count", "fast_init",
                                                "nvme_path", "buffer_size", "max_in_cpu",
                                                "pipeline_read", "pipeline_write", "ratio"};
const std::set<std::string> kMapped = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "amp", "zero_optimization",
    "gradient_clipping", "activation_checkpointing", "steps_per_print", "tensorboard"};


void Mapper::precision() {
  auto enabled = [&](const char* section) -> std::optional<bool> {  // nullopt: absent or "auto"
    const Json* s = json::find(*doc_, section);
    if (!s) return std::nullopt;
    object(*s, section);
    const Json* e = json::find(*s, "enabled");
    if (!e || is_auto(*e)) return e ? std::nullopt : std::optional<bool>(false);
    return boolean(*e, cat(section, ".enabled"));
  };
  const char* bf_name = json::find(*doc_, "bf16") ? "bf16" : "bfloat16";
  const std::optional<bool> fp16 = enabled("fp16"), bf16 = enabled(bf_name);
  if (const Json* amp = json::find(*doc_, "amp")) {
    object(*amp, "amp");
    if (const Json* e = json::find(*amp, "enabled"); e && boolean(*e, "amp.enabled"))
      fail("amp.enabled", "=true: Apex AMP is not built; use fp16 or bf16");
  }
  if (fp16.value_or(false) && bf16.value_or(false))
    fail("fp16.enabled", cat("and ", bf_name, ".enabled are both true; DeepSpeed and meshtrain "
                             "train in one of them"));
  if (bf16.value_or(false)) set("train.precision", "bf16", cat(bf_name, ".enabled"));
  if (const Json* b = json::find(*doc_, bf_name))
    for (auto it = b->begin(); it != b->end(); ++it)
      if (it.key() != "enabled") no_effect(cat(bf_name, ".", it.key()));
  const Json* f = json::find(*doc_, "fp16");
  if (!f) return;
  if (fp16.value_or(false)) set("train.precision", "fp16", "fp16.enabled");
  const Json* e = json::find(*f, "enabled");
  const bool maybe = fp16.value_or(false) || (e && is_auto(*e));  // "auto": fp16 if meshtrain's is
  const std::string P = "fp16.";
  for (auto it = f->begin(); it != f->end(); ++it) {
    const std::string& k = it.key();
    if (k == "enabled") continue;
    if (!maybe) {
      no_effect(P + k, "fp16 is off");
      continue;
    }
    if (k == "loss_scale") {
      const double s = number(*it, P + k, 0);
      if (s > 0) {
        set("train.loss_scaling", "static", P + k);
        set("train.loss_scale_init", num(s), P + k);
      }
    } else if (k == "initial_scale_power") {
      const long pw = integer(*it, P + k, 0);
      if (pw > 100) fail(P + k, cat("=", pw, " puts the loss scale 2^", pw, " beyond fp32"));
      set("train.loss_scale_init", num(std::ldexp(1.0, static_cast<int>(pw))), P + k);
    } else if (k == "loss_scale_window") {
      set("train.loss_scale_window", std::to_string(integer(*it, P + k, 1)), P + k);
    } else if (k == "hysteresis") {
      set("train.loss_scale_hysteresis", std::to_string(integer(*it, P + k, 1)), P + k);
    } else if (k == "consecutive_hysteresis") {
      set("train.loss_scale_consecutive_hysteresis", boolean(*it, P + k) ? "true" : "false", P + k);
    } else if (k == "min_loss_scale") {
      if (number(*it, P + k, 0) <= 0) fail(P + k, "must be > 0");
      set("train.loss_scale_min", num(it->get<double>()), P + k);
    } else if (k == "auto_cast" || k == "fp16_master_weights_and_grads") {
      if (boolean(*it, P + k))
        no_effect(P + k, k == "auto_cast" ? "meshtrain casts every layer"
                                          : "meshtrain keeps fp32 master weights");
    } else {
      unknown(k, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                  "hysteresis", "consecutive_hysteresis", "min_loss_scale", "auto_cast",
                  "fp16_master_weights_and_grads"}, P);
    }
  }
  // DeepSpeed's documented default; meshtrain's own is 1 (halve on every overflow).
  if (maybe && !json::find(*f, "hysteresis") && !json::find(*f, "loss_scale"))
    set("train.loss_scale_hysteresis", "2", "fp16.hysteresis (DeepSpeed's default)");
}

void Mapper::zero() {
  const Json* z = json::find(*doc_, "zero_optimization");
  if (!z) return;
  if (z->is_boolean()) {  // DeepSpeed's legacy form: true is stage 1
    set("zero.stage", z->get<bool>() ? "1" : "0", "zero_optimization");
    return;
  }
  object(*z, "zero_optimization");
  const std::string P = "zero_optimization.";
  std::optional<long> reduce, gather;
  for (auto it = z->begin(); it != z->end(); ++it) {
    const std::string& k = it.key();
    if (k == "stage") {
      const long s = integer(*it, P + k, 0);
      if (s > 3) fail(P + k, cat("=", s, " does not exist (0-3)"));
      set("zero.stage", std::to_string(s), P + k);
    } else if (k == "offload_optimizer" || k == "offload_param") {
      if (it->is_null()) continue;
      object(*it, P + k);
      std::string device = "none";
      for (auto o = it->begin(); o != it->end(); ++o) {
        if (o.key() == "device") device = text(*o, P + k + ".device");
        else if (kOffloadNoEffect.count(o.key())) no_effect(P + k + "." + o.key());
        else unknown(o.key(), {"device", "pin_memory", "buffer_count", "nvme_path"}, P + k + ".");
      }
      if (device != "none" && device != "cpu" && device != "nvme")
        fail(P + k + ".device", cat("='", device, "' is not one of none, cpu, nvme"));
      if (k == "offload_param" && device != "none")
        fail(P + k + ".device", cat("='", device, "': meshtrain cannot offload parameters; remove "
                                    "offload_param (`meshtrain plan` tells whether the model "
                                    "fits without it)"));
      if (device == "nvme")
        fail(P + k + ".device", "='nvme': meshtrain offloads the optimizer to host memory only "
                                "(device cpu)");
      set("zero.offload_optimizer", device, P + k + ".device");
    } else if (k == "cpu_offload") {  // legacy
      if (boolean(*it, P + k)) set("zero.offload_optimizer", "cpu", P + k);
    } else if (k == "overlap_comm") {
      set("dp.overlap", boolean(*it, P + k) ? "true" : "false", P + k);
    } else if (k == "reduce_bucket_size" || k == "allgather_bucket_size") {
      const long n = is_auto(*it) && k == "reduce_bucket_size" && ctx_.n_embd > 0
                         ? static_cast<long>(ctx_.n_embd) * ctx_.n_embd  // HF Trainer: hidden^2
                         : integer(*it, P + k, 1);
      (k == "reduce_bucket_size" ? reduce : gather) = n;
    } else if (k == "contiguous_gradients" || k == "reduce_scatter" ||
               k == "allgather_partitions") {
      // What meshtrain always does: gradients in one flat buffer, reduce-scattered at ZeRO
      // 2/3, updated pieces all-gathered.
      if (!boolean(*it, P + k)) no_effect(P + k + "=false", "meshtrain always does it");
    } else if (kZeroNoEffect.count(k)) {
      no_effect(P + k);
    } else {
      std::set<std::string> known(kZeroNoEffect);
      known.insert({"stage", "offload_optimizer", "offload_param", "overlap_comm",
                    "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients",
                    "reduce_scatter", "allgather_partitions", "cpu_offload"});
      unknown(k, known, P);
    }
  }
  // One bucket size in meshtrain: its parameter all-gathers (ZeRO 1/2) follow the reduction's.
  const std::optional<long> bucket = reduce ? reduce : gather;
  if (bucket) {
    const double mb = static_cast<double>(*bucket) * ctx_.grad_bytes / 1048576.0;
    set("dp.bucket_mb", num(mb), P + (reduce ? "reduce_bucket_size" : "allgather_bucket_size"));
  }
  if (reduce && gather && *reduce != *gather)
    no_effect(P + "allgather_bucket_size", "meshtrain gathers in its reduction buckets, "
                                           "dp.bucket_mb");
}

void Mapper::activation_checkpointing() {
  const Json* a = json::find(*doc_, "activation_checkpointing");
  if (!a) return;
  object(*a, "activation_checkpointing");
  // The section configures the checkpointing a DeepSpeed model calls; meshtrain checkpoints
  // every block.
  set("train.recompute", "true", "activation_checkpointing");
  const std::string P = "activation_checkpointing.";
  for (auto it = a->begin(); it != a->end(); ++it) {
    const std::string& k = it.key();
    if (k == "partition_activations") {
      // Each tp rank keeps 1/tp of the checkpointed activations: sequence parallelism's split.
      if (boolean(*it, P + k)) set("tp.sequence_parallel", "true", P + k);
    } else if (k == "cpu_checkpointing") {
      if (boolean(*it, P + k))
        fail(P + k, "=true: meshtrain keeps checkpointed activations on the device");
    } else if (k == "contiguous_memory_optimization" || k == "number_checkpoints" ||
               k == "synchronize_checkpoint_boundary" || k == "profile") {
      if (!it->is_null() && (!it->is_boolean() || it->get<bool>())) no_effect(P + k);
    } else {
      unknown(k, {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                  "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}, P);
    }
  }
}

void Mapper::tensorboard() {
  const Json* t = json::find(*doc_, "tensorboard");
  if (!t) return;
  object(*t, "tensorboard");
  const Json* e = json::find(*t, "enabled");
  std::string path, job = "DeepSpeedJobName";  // DeepSpeed's defaults
  for (auto it = t->begin(); it != t->end(); ++it) {
    if (it.key() == "output_path") path = text(*it, "tensorboard.output_path");
    else if (it.key() == "job_name") job = text(*it, "tensorboard.job_name");
    else if (it.key() != "enabled")
      unknown(it.key(), {"enabled", "output_path", "job_name"}, "tensorboard.");
  }
  if (!e || !boolean(*e, "tensorboard.enabled")) return;
  if (path.empty()) path = "runs";
  if (path.back() != '/') path += '/';
  set("train.tensorboard", path + job, "tensorboard");
}

}  // namespace meshtrain::app::ds
