// --deepspeed FILE (issue 37): the seeds' configurations as written, DeepSpeed's documented
// examples (docs/_pages/config-json.md, docs/_tutorials/getting-started.md), HF Trainer's
// "auto", wrong types, unknown keys, contradictions, and the precedence command line >
// DeepSpeed file > --config INI > defaults.
#include <fstream>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/core/error.hpp"

using namespace meshtrain;
namespace po = boost::program_options;
using mt_test::contains;

namespace {

std::string write(const std::string& name, const std::string& text) {
  const std::string path = "test_ds_" + name + ".json";
  std::ofstream(path) << text;
  return path;
}

app::DsParsed parse(const std::string& file, std::vector<std::string> args, int world) {
  args.push_back("--deepspeed");
  args.push_back(file);
  return app::parse_with_deepspeed(
      args, app::train_options(),
      [world](const po::variables_map& b) { return app::train_context(b, world); },
      app::train_layer);
}
app::DsParsed parse_text(const std::string& name, const std::string& json,
                         std::vector<std::string> args = {}, int world = 1) {
  return parse(write(name, json), std::move(args), world);
}

template <class T>
T get(const app::DsParsed& p, const char* key) {
  return p.parsed.vm[key].as<T>();
}
int i(const app::DsParsed& p, const char* k) { return get<int>(p, k); }
double d(const app::DsParsed& p, const char* k) { return get<double>(p, k); }
std::string s(const app::DsParsed& p, const char* k) { return get<std::string>(p, k); }
bool b(const app::DsParsed& p, const char* k) { return get<bool>(p, k); }

const std::string kSeeds = MESHTRAIN_SOURCE_DIR "/tests/cli/deepspeed/";

}  // namespace

TEST_CASE("seed 002's ds_config.json as written, on 8 GPUs with tp 2 and pp 4", "[deepspeed]") {
  const auto p = parse(kSeeds + "seed002_ds_config.json", {"--mesh.tp", "2", "--mesh.pp", "4"}, 8);
  // 4096 = micro x 8 x dp 1
  REQUIRE(i(p, "train.micro_batch") == 512);
  REQUIRE(i(p, "train.grad_accum") == 8);
  REQUIRE(i(p, "mesh.dp") == 1);
  REQUIRE(p.mapping.global_batch == 4096);
  REQUIRE(d(p, "train.lr") == 6e-5);
  REQUIRE(s(p, "train.lr_schedule") == "constant");  // DeepSpeed without a scheduler
  REQUIRE(d(p, "train.beta1") == 0.9);
  REQUIRE(d(p, "train.beta2") == 0.999);  // FusedAdam's defaults, not meshtrain's
  REQUIRE(d(p, "train.weight_decay") == 0);
  REQUIRE(s(p, "train.precision") == "fp16");
  REQUIRE(i(p, "train.loss_scale_hysteresis") == 2);
  REQUIRE(i(p, "zero.stage") == 3);
  REQUIRE(s(p, "zero.offload_optimizer") == "cpu");
  REQUIRE(b(p, "train.recompute"));
  REQUIRE(b(p, "tp.sequence_parallel"));  // partition_activations
  REQUIRE(p.mapping.warning() ==
          kSeeds + "seed002_ds_config.json (--deepspeed): no effect in meshtrain: "
                   "activation_checkpointing.contiguous_memory_optimization");
  // On a CPU build train refuses fp16 naming the DeepSpeed key that asked for it.
  if (kDeviceIsHost) {
    const model::GptConfig mc = app::model_config(p.parsed.vm);
    REQUIRE_THROWS_WITH(app::with_deepspeed_origin(p, [&] { app::train_config(p.parsed.vm, mc); }),
                        contains("train.precision=fp16 needs a GPU build") &&
                            contains("(set by fp16.enabled in " + kSeeds + "seed002"));
  }
}

TEST_CASE("seed 000's HF Trainer ZeRO-2 configuration: \"auto\" is meshtrain's own value",
          "[deepspeed]") {
  const auto p = parse(kSeeds + "seed000_hf_zero2.json",
                       {"--train.micro_batch", "4", "--train.grad_accum", "2", "--train.lr",
                        "3e-4"}, 2);
  REQUIRE(i(p, "train.micro_batch") == 4);
  REQUIRE(i(p, "train.grad_accum") == 2);
  REQUIRE(p.mapping.global_batch == 16);
  REQUIRE(d(p, "train.lr") == 3e-4);
  REQUIRE(d(p, "train.beta2") == 0.95);  // "auto": meshtrain's default
  REQUIRE(s(p, "train.lr_schedule") == "ds_warmup");
  REQUIRE(i(p, "train.warmup") == 20);   // "auto": meshtrain's default
  REQUIRE(d(p, "train.warmup_min_lr") == 0);
  REQUIRE(s(p, "train.warmup_type") == "log");
  REQUIRE(s(p, "train.precision") == "fp32");  // fp16 "auto" and meshtrain's fp32
  REQUIRE(i(p, "zero.stage") == 2);
  REQUIRE(s(p, "zero.offload_optimizer") == "cpu");
  REQUIRE(b(p, "dp.overlap"));
  REQUIRE(d(p, "dp.bucket_mb") == Approx(2e8 * 4 / 1048576.0));
  REQUIRE(i(p, "train.log_every") == 2000);
  REQUIRE(d(p, "train.loss_scale_init") == 65536);
  REQUIRE(p.mapping.warning().find("zero_optimization.offload_optimizer.pin_memory") !=
          std::string::npos);
  REQUIRE(p.mapping.warning().find("wall_clock_breakdown") == std::string::npos);  // false
}

TEST_CASE("DeepSpeed's documented examples", "[deepspeed]") {
  SECTION("getting started") {
    const auto p = parse_text("getting_started", R"({
      "train_batch_size": 8, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
      "fp16": {"enabled": true}, "zero_optimization": true})", {}, 4);
    REQUIRE(i(p, "train.micro_batch") == 2);
    REQUIRE(i(p, "train.grad_accum") == 1);
    REQUIRE(i(p, "zero.stage") == 1);
    REQUIRE(s(p, "train.precision") == "fp16");
    REQUIRE(d(p, "train.lr") == 0.00015);
    REQUIRE(p.mapping.warning().empty());
  }
  SECTION("optimizer and scheduler") {
    const auto p = parse_text("optimizer", R"({
      "train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999],
                                               "eps": 1e-8, "weight_decay": 3e-7}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                   "warmup_num_steps": 1000}}})", {}, 2);
    REQUIRE(i(p, "train.micro_batch") == 2);
    REQUIRE(i(p, "train.grad_accum") == 1);
    REQUIRE(d(p, "train.beta1") == 0.8);
    REQUIRE(d(p, "train.weight_decay") == 3e-7);
    REQUIRE(d(p, "train.lr") == 0.001);
    REQUIRE(i(p, "train.warmup") == 1000);
    REQUIRE(s(p, "train.warmup_type") == "log");  // DeepSpeed's default
    REQUIRE(s(p, "train.lr_schedule") == "ds_warmup");
  }
  SECTION("fp16 with every loss-scaling key") {
    const auto p = parse_text("fp16", R"({"fp16": {"enabled": true, "auto_cast": false,
      "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
      "consecutive_hysteresis": false, "min_loss_scale": 1}})");
    REQUIRE(s(p, "train.precision") == "fp16");
    REQUIRE(s(p, "train.loss_scaling") == "auto");  // dynamic: on for fp16
    REQUIRE(d(p, "train.loss_scale_init") == 65536);
    REQUIRE(i(p, "train.loss_scale_window") == 1000);
    REQUIRE(i(p, "train.loss_scale_hysteresis") == 2);
    REQUIRE_FALSE(b(p, "train.loss_scale_consecutive_hysteresis"));
    REQUIRE(d(p, "train.loss_scale_min") == 1);
    const auto st = parse_text("fp16_static", R"({"fp16": {"enabled": true, "loss_scale": 128}})");
    REQUIRE(s(st, "train.loss_scaling") == "static");
    REQUIRE(d(st, "train.loss_scale_init") == 128);
  }
  SECTION("ZeRO stage 2") {
    const auto p = parse_text("zero2", R"({"zero_optimization": {"stage": 2,
      "allgather_partitions": true, "allgather_bucket_size": 5e8, "overlap_comm": false,
      "reduce_scatter": true, "reduce_bucket_size": 5e8, "contiguous_gradients": true,
      "stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": 5e8}})");
    REQUIRE(i(p, "zero.stage") == 2);
    REQUIRE_FALSE(b(p, "dp.overlap"));
    REQUIRE(d(p, "dp.bucket_mb") == Approx(5e8 * 4 / 1048576.0));
    REQUIRE(p.mapping.warning().find("zero_optimization.stage3_max_live_parameters, "
                                     "zero_optimization.stage3_prefetch_bucket_size") !=
            std::string::npos);
  }
  SECTION("activation checkpointing, all off") {
    const auto p = parse_text("ac", R"({"activation_checkpointing": {"partition_activations":
      false, "cpu_checkpointing": false, "contiguous_memory_optimization": false,
      "number_checkpoints": null, "synchronize_checkpoint_boundary": false, "profile": false}})");
    REQUIRE(b(p, "train.recompute"));
    REQUIRE_FALSE(b(p, "tp.sequence_parallel"));
    REQUIRE(p.mapping.warning().empty());
  }
  SECTION("WarmupDecayLR and WarmupCosineLR") {
    const auto p = parse_text("decay", R"({"scheduler": {"type": "WarmupDecayLR", "params":
      {"total_num_steps": 500, "warmup_min_lr": 1e-6, "warmup_max_lr": 3e-4,
       "warmup_num_steps": 50, "warmup_type": "linear"}}})");
    REQUIRE(s(p, "train.lr_schedule") == "ds_warmup_decay");
    REQUIRE(get<long long>(p, "train.decay_steps") == 500);
    REQUIRE(d(p, "train.lr") == 3e-4);
    REQUIRE(d(p, "train.warmup_min_lr") == 1e-6);
    const auto c = parse_text("cosine", R"({"scheduler": {"type": "WarmupCosineLR", "params":
      {"total_num_steps": 500, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.5}}})",
                              {"--train.lr", "2e-3"});
    REQUIRE(s(c, "train.lr_schedule") == "ds_warmup_cosine");
    REQUIRE(d(c, "train.min_lr") == Approx(1e-3));        // of the command line's lr
    REQUIRE(d(c, "train.warmup_min_lr") == Approx(2e-4));
    REQUIRE(i(c, "train.warmup") == 1000);                 // DeepSpeed's default
  }
}

TEST_CASE("DeepSpeed's batch rule, checked and derived", "[deepspeed]") {
  SECTION("two given derive the third") {
    const auto p = parse_text("tb_mb", R"({"train_batch_size": 32,
      "train_micro_batch_size_per_gpu": 4})", {}, 2);
    REQUIRE(i(p, "train.grad_accum") == 4);
    const auto q = parse_text("tb_ga", R"({"train_batch_size": 32,
      "gradient_accumulation_steps": 2})", {"--mesh.tp", "2"}, 4);  // dp 2
    REQUIRE(i(q, "train.micro_batch") == 8);
    const auto t = parse_text("tb", R"({"train_batch_size": 16})", {}, 4);
    REQUIRE(i(t, "train.micro_batch") == 4);
    REQUIRE(i(t, "train.grad_accum") == 1);
  }
  SECTION("the command line's micro-batch stands in for the file's") {
    const auto p = parse_text("cmd_mb", R"({"train_batch_size": 32,
      "train_micro_batch_size_per_gpu": 8})", {"--train.micro_batch", "4"}, 2);
    REQUIRE(i(p, "train.micro_batch") == 4);
    REQUIRE(i(p, "train.grad_accum") == 4);
    REQUIRE(p.mapping.note().find("train.micro_batch=4 over train_micro_batch_size_per_gpu (8)") !=
            std::string::npos);
  }
  SECTION("contradictions and impossible values name the key and the file") {
    REQUIRE_THROWS_WITH(parse_text("bad3", R"({"train_batch_size": 32,
      "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", {}, 2),
                        contains("train_batch_size=32 but micro-batch 4") &&
                            contains("x dp 2 = 16") &&
                            contains("(test_ds_bad3.json, --deepspeed)"));
    REQUIRE_THROWS_WITH(parse_text("bad_div", R"({"train_batch_size": 30,
      "train_micro_batch_size_per_gpu": 4})", {}, 2),
                        contains("=30 is not divisible by micro-batch x dp = 8"));
    REQUIRE_THROWS_WITH(parse_text("ga_only", R"({"gradient_accumulation_steps": 4})"),
                        contains("gradient_accumulation_steps is given without") &&
                            contains("(test_ds_ga_only.json, --deepspeed)"));
    REQUIRE_THROWS_WITH(parse_text("cmd_bad", R"({"train_batch_size": 32,
      "gradient_accumulation_steps": 2})", {"--train.micro_batch", "3"}, 2),
                        contains("(--train.micro_batch on the command line)"));
  }
}

TEST_CASE("wrong types, unknown keys, \"auto\" and contradictions", "[deepspeed]") {
  REQUIRE_THROWS_WITH(parse_text("t1", R"({"train_batch_size": "32"})"),
                      contains("train_batch_size=\"32\" must be an integer (test_ds_t1.json, "
                               "--deepspeed)"));
  REQUIRE_THROWS_WITH(parse_text("t2", R"({"fp16": {"enabled": "yes"}})"),
                      contains("fp16.enabled=\"yes\" must be true or false (test_ds_t2.json"));
  REQUIRE_THROWS_WITH(parse_text("t3", R"({"optimizer": {"type": "AdamW", "params":
    {"betas": [0.9]}}})"), contains("optimizer.params.betas") && contains("two numbers"));
  REQUIRE_THROWS_WITH(parse_text("t4", R"({"zero_optimization": {"stage": 2.5}})"),
                      contains("zero_optimization.stage") && contains("must be an integer"));
  REQUIRE_THROWS_WITH(parse_text("t5", R"([1, 2])"), contains("a JSON object"));
  REQUIRE_THROWS_WITH(parse_text("t6", R"({"train_batch_size": 8,)"),
                      contains("test_ds_t6.json' (--deepspeed): JSON error"));
  // Unknown keys: one warning, with the closest key.
  const auto u = parse_text("unknown", R"({"train_batch_sizee": 8, "zero_optimization":
    {"stagee": 1}, "flops_profiler": {"enabled": true}, "wandb": {"enabled": false}})");
  REQUIRE(u.mapping.warning() ==
          "test_ds_unknown.json (--deepspeed): no effect in meshtrain: flops_profiler; not "
          "DeepSpeed keys, ignored: zero_optimization.stagee (did you mean "
          "zero_optimization.stage?), train_batch_sizee (did you mean train_batch_size?)");
  // "auto" resolved from the model (HF Trainer's hidden_size^2 buckets) ...
  const auto a = parse_text("auto_bucket", R"({"zero_optimization": {"stage": 1,
    "reduce_bucket_size": "auto"}})", {"--model.n_embd", "64"});
  REQUIRE(d(a, "dp.bucket_mb") == Approx(64.0 * 64 * 4 / 1048576.0));
  // ... or refused where nothing says what it would be.
  REQUIRE_THROWS_WITH(parse_text("auto_stage", R"({"zero_optimization": {"stage": "auto"}})"),
                      contains("zero_optimization.stage is \"auto\", which meshtrain cannot "
                               "resolve") &&
                          contains("(test_ds_auto_stage.json, --deepspeed)"));
  REQUIRE_THROWS_WITH(parse_text("both", R"({"fp16": {"enabled": true}, "bf16": {"enabled":
    true}})"), contains("fp16.enabled") && contains("bf16.enabled are both true"));
  REQUIRE_THROWS_WITH(parse_text("param", R"({"zero_optimization": {"stage": 3,
    "offload_param": {"device": "cpu"}}})"), contains("meshtrain cannot offload parameters"));
  REQUIRE_THROWS_WITH(parse_text("nvme", R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme"}}})"), contains("='nvme'"));
  REQUIRE_THROWS_WITH(parse_text("onecycle", R"({"scheduler": {"type": "OneCycle"}})"),
                      contains("scheduler.type") && contains("'OneCycle'"));
  REQUIRE_THROWS_WITH(parse_text("lamb", R"({"optimizer": {"type": "Lamb"}})"),
                      contains("optimizer.type") && contains("'Lamb'"));
  REQUIRE_THROWS_WITH(parse_text("total", R"({"scheduler": {"type": "WarmupDecayLR"}})"),
                      contains("scheduler.params.total_num_steps") && contains("is missing"));
  REQUIRE_THROWS_WITH(parse_text("l2", R"({"optimizer": {"type": "Adam", "params":
    {"adam_w_mode": false, "weight_decay": 0.1}}})"), contains("L2 regularisation"));
  REQUIRE_THROWS_WITH(parse_text("cpu_ckpt", R"({"activation_checkpointing":
    {"cpu_checkpointing": true}})"), contains("activation_checkpointing.cpu_checkpointing"));
  REQUIRE_THROWS_WITH(parse(std::string("no_such_ds.json"), {}, 1),
                      contains("'no_such_ds.json' (--deepspeed) cannot be opened"));
}

TEST_CASE("a later error names the DeepSpeed key of the option it is about", "[deepspeed]") {
  const auto p = parse_text("origin", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2}}})");
  const auto at = [&](const std::string& m) { return p.annotate(m); };
  REQUIRE(at("train.lr=1 is wrong") ==
          "train.lr=1 is wrong (set by optimizer.params.lr in test_ds_origin.json, --deepspeed)");
  REQUIRE(at("train.lr_schedule='x' is wrong") ==
          "train.lr_schedule='x' is wrong (set by scheduler.type in test_ds_origin.json, "
          "--deepspeed)");
  REQUIRE(at("mesh.tp=3 is wrong") == "mesh.tp=3 is wrong");
  // WarmupCosineLR over 2 steps with DeepSpeed's 1000 warmup steps: refused by train's check.
  const model::GptConfig mc = app::model_config(p.parsed.vm);
  REQUIRE_THROWS_WITH(app::with_deepspeed_origin(p, [&] { app::train_config(p.parsed.vm, mc); }),
                      contains("train.decay_steps=2 must be larger than train.warmup=1000") &&
                          contains("(set by scheduler.params.total_num_steps in "
                                   "test_ds_origin.json, --deepspeed)"));
}

TEST_CASE("precedence: command line > DeepSpeed file > --config INI > defaults", "[deepspeed]") {
  const std::string ini = "test_ds_precedence.ini";
  std::ofstream(ini) << "[train]\nlr = 0.5\nbeta1 = 0.7\nsteps = 9\n";
  const std::string ds = write("precedence", R"({"optimizer": {"type": "AdamW",
    "params": {"lr": 1e-4, "betas": "auto"}}, "gradient_clipping": 0.5})");
  const auto p = parse(ds, {"--config", ini}, 1);
  REQUIRE(d(p, "train.lr") == 1e-4);    // file over INI
  REQUIRE(d(p, "train.beta1") == 0.7);  // "auto": the INI's
  REQUIRE(get<long long>(p, "train.steps") == 9);
  REQUIRE(d(p, "train.grad_clip") == 0.5);
  const auto q = parse(ds, {"--config", ini, "--train.lr", "2e-4"}, 1);
  REQUIRE(d(q, "train.lr") == 2e-4);  // command line over file
  REQUIRE(q.mapping.note() == "test_ds_precedence.json (--deepspeed): the command line sets "
                              "train.lr=0.0002 over optimizer.params.lr (0.0001)");
  // The INI that `meshtrain config` prints trains the same run.
  const std::string printed =
      config::resolved_ini(q.parsed.vm, app::train_options(), /*defaults=*/false);
  REQUIRE(printed.find("lr = 0.0002") != std::string::npos);
  REQUIRE(printed.find("lr_schedule = constant") != std::string::npos);
  REQUIRE(printed.find("deepspeed") == std::string::npos);
}
