// The planner without MPI peers: calibration files, the cost model's structure (pipeline
// bubble, DP overlap, tp/dp terms only where the layout has them), the H200 calibration against
// the figures it was derived from, the search (pruning, ranking, the seeds' table), and the INI
// a layout is written as, read back through `meshtrain train`'s options. FP8's memory and
// step-time terms: test_plan_fp8.cpp.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "harness.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/workspace.hpp"
#include "meshtrain/plan/memory.hpp"
#include "meshtrain/plan/report.hpp"
#include "plan_model_util.hpp"
#include "plan_test_util.hpp"

using namespace meshtrain;
using mt_test::Approx;

using plan_test::h200;
using plan_test::node;

TEST_CASE("calibration files round-trip and interpolate GEMM throughput", "[plan]") {
  const auto c = h200();
  REQUIRE_FALSE(c.measured);
  REQUIRE(c.device == "gpu");
  const auto back = plan::parse_calibration(plan::to_json(c), "round trip");
  REQUIRE(back.gemm.size() == c.gemm.size());
  REQUIRE(back.intra.busbw_gbs == c.intra.busbw_gbs);
  REQUIRE(back.inter.alpha_us == c.inter.alpha_us);
  REQUIRE(back.rank_slowdown == c.rank_slowdown);
  REQUIRE(c.slowdown(8) == 1);
  // Exact at the measured shapes; between them near the closest in size and intensity: a 7B
  // block GEMM is near the 8192^3 ceiling, a tiny one near the smallest point.
  REQUIRE(c.gemm_tflops(16384, 768, 768) == Approx(410));
  REQUIRE(c.gemm_tflops(8192, 8192, 8192) == Approx(790));
  REQUIRE(c.gemm_tflops(16384, 12288, 4096) > 700);
  REQUIRE(c.gemm_tflops(256, 768, 768) < 200);
  const double mid = c.gemm_tflops(16384, 1536, 768);
  REQUIRE(mid > 410);
  REQUIRE(mid < 595);
  REQUIRE_THROWS_AS(plan::parse_calibration("{\"device\": \"tpu\"}", "x"), ConfigError);
  // The FP8 GEMM rate: h200.json predates it, so the measured default ratio times its bf16
  // rate; a file's own ratio wins; the CPU build's FP8 GEMMs are fp32 GEMMs.
  REQUIRE(c.fp8_speedup(false) == Approx(1.68));
  REQUIRE(c.fp8_speedup(true) == Approx(1.54));
  REQUIRE(c.fp8_gemm_tflops(8192, 8192, 8192, false) == Approx(1.68 * 790));
  REQUIRE(back.fp8_speedup_tensorwise == Approx(1.68));
  const auto given = plan::parse_calibration(
      "{\"device\": \"gpu\", \"fp8_gemm_speedup\": {\"tensorwise\": 1.9}}", "x");
  REQUIRE(given.fp8_speedup(false) == Approx(1.9));
  REQUIRE(given.fp8_speedup(true) == Approx(1.54));
  REQUIRE(plan::parse_calibration("{}", "x").fp8_speedup(false) == 1);
  REQUIRE_THROWS_AS(plan::parse_calibration("{\"fp8_gemm_speedup\": {\"rowwise\": -1}}", "x"),
                    ConfigError);
  REQUIRE_THROWS_AS(plan::load_calibration("no_such_calibration.json"), ConfigError);
}

TEST_CASE("the H200 calibration reproduces the measured GPT-2 124M step it was derived from",
          "[plan]") {
  // perf/archive/journal.md: bf16 trainer steps, micro-batch 16: 33.7 ms, micro-batch 32: 63.4 ms
  // (the steps the calibration's GEMM and bandwidth points were fitted to); device memory in use
  // (CUDA context included) of the trainer with the LM head in chunks of rows ("The LM head in
  // chunks of rows"): 8027 MiB at micro-batch 16, 13071 MiB at 32.
  const auto cal = h200();
  const auto cfg = model::preset("gpt2-124m");
  for (auto [mb, ms, gib] :
       {std::tuple{16, 33.7, 8027.0 / 1024}, std::tuple{32, 63.4, 13071.0 / 1024}}) {
    plan::Layout l;
    l.micro_batch = mb;
    l.precision = plan::Precision::bf16;
    const auto cost = plan::step_cost(cfg, 1024, l, node(1), cal);
    const auto mem = plan::peak_memory(cfg, 1024, l, {false, cal.runtime_bytes});
    INFO("micro-batch " << mb << ": " << cost.step_s * 1e3 << " ms, " << mem.device() / (1 << 30)
                        << " GiB");
    REQUIRE(std::fabs(cost.step_s * 1e3 / ms - 1) < 0.05);
    REQUIRE(std::fabs(mem.device() / (1u << 30) / gib - 1) < 0.05);
  }
}

TEST_CASE("cost model: the terms a layout has, and the analytic bubble", "[plan]") {
  const auto cal = h200();
  auto cfg = model::preset("gpt2-350m");
  plan::Layout base;
  base.precision = plan::Precision::bf16;
  base.micro_batch = 4;
  base.n_micro = 8;
  const auto one = plan::step_cost(cfg, 1024, base, node(1), cal);
  REQUIRE(one.tp_comm_s == 0);
  REQUIRE(one.dp_comm_s == 0);
  REQUIRE(one.pp_bubble_s == 0);
  // Pipeline: (pp - 1) / v stage-times of bubble; interleaving divides it by v.
  plan::Layout pp = base;
  pp.pp = 4;
  const auto c4 = plan::step_cost(cfg, 1024, pp, node(4), cal);
  const double stage_mb = c4.compute_s / pp.n_micro;  // slowest stage, one micro-batch
  REQUIRE(c4.pp_bubble_s == Approx(3 * stage_mb).epsilon(0.02));
  pp.schedule = parallel::ScheduleKind::interleaved;
  pp.virtual_chunks = 2;
  const auto c4v = plan::step_cost(cfg, 1024, pp, node(4), cal);
  REQUIRE(c4v.pp_bubble_s < 0.6 * c4.pp_bubble_s);
  // Tensor parallelism adds its collectives; DP exposes at most all of its reduction, at least
  // nothing, and more over the slow links when the group leaves the node.
  plan::Layout tp = base;
  tp.tp = 4;
  REQUIRE(plan::step_cost(cfg, 1024, tp, node(4), cal).tp_comm_s > 0);
  plan::Layout dp = base;
  dp.dp = 8;
  const auto d8 = plan::step_cost(cfg, 1024, dp, node(8), cal);
  REQUIRE(d8.dp_comm_s > 0);
  REQUIRE(d8.dp_comm_s <= d8.dp_comm_total_s);
  dp.dp = 16;
  const auto d16 = plan::step_cost(cfg, 1024, dp, node(16), cal);
  REQUIRE(plan::placement(dp, 8).dp_inter);
  REQUIRE(d16.dp_comm_total_s > 5 * d8.dp_comm_total_s);
  REQUIRE(d16.tokens_per_s > 0);
  REQUIRE(d16.mfu > 0);
  REQUIRE(d16.mfu < 1);
}

TEST_CASE("search: every ranked layout fits, fastest first, and the seeds' table applies",
          "[plan]") {
  const auto cal = h200();
  plan::SearchOptions o;
  o.cluster = node(8);
  o.global_batch = 64;
  // A 7B-class model on one node of 40 GiB devices: does not fit on one, largest layer does.
  auto big = model::preset("gpt2-1.5b");
  big.n_layer = 32;
  big.n_embd = 4096;
  big.n_head = 32;
  big.block_size = 2048;
  o.cluster.memory_bytes = 40.0 * (1u << 30);
  const auto r = plan::search(big, 2048, o, cal);
  REQUIRE_FALSE(r.scenario.fits_one_device);
  REQUIRE(r.scenario.largest_layer_fits);
  REQUIRE(r.scenario.single_node);
  REQUIRE(r.pruned_memory > 0);
  REQUIRE_FALSE(r.ranked.empty());
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    REQUIRE(r.ranked[i].memory.device() <= o.cluster.memory_bytes * cal.usable_memory_fraction);
    if (i) REQUIRE(r.ranked[i].cost.step_s >= r.ranked[i - 1].cost.step_s);
  }
  REQUIRE(plan::rule_agreement(r, r.ranked.front()) == "agrees");  // PP, ZeRO or TP
  // The same model over 64 devices with slow inter-node links: DP+PP+TP+ZeRO-1 is the row.
  o.cluster.world = 64;
  o.global_batch = 512;
  const auto r64 = plan::search(big, 2048, o, cal);
  REQUIRE_FALSE(r64.scenario.fast_inter_node);
  REQUIRE(r64.scenario.rule.find("DP+PP+TP+ZeRO-1") != std::string::npos);
  // A small model fits: DDP or ZeRO is the row, and pure DP layouts agree with it.
  const auto small = model::preset("gpt2-124m");
  o.cluster.world = 8;
  o.global_batch = 64;
  o.cluster.memory_bytes = 80.0 * (1u << 30);
  const auto rs = plan::search(small, 1024, o, cal);
  REQUIRE(rs.scenario.fits_one_device);
  for (const auto& c : rs.ranked)
    if (c.layout.pp == 1 && c.layout.tp == 1) REQUIRE(plan::rule_agreement(rs, c) == "agrees");
  REQUIRE(plan::family(rs.ranked.front().layout).size() > 0);
  // Layouts the code refuses are reported as such.
  plan::Layout bad;
  bad.tp = 5;  // does not divide 12 heads
  REQUIRE_FALSE(plan::layout_error(small, 1024, bad).empty());
  bad.tp = 1;
  bad.pp = 2;
  bad.dp = 2;
  bad.zero_stage = 2;  // ZeRO 2/3 with pipelines: supported (the wte bucket is deferred)
  REQUIRE(plan::layout_error(small, 1024, bad).empty());
  bad.schedule = parallel::ScheduleKind::interleaved;
  bad.virtual_chunks = 2;
  bad.n_micro = 3;  // not a multiple of pp
  REQUIRE(plan::layout_error(small, 1024, bad).find("train.grad_accum=3") != std::string::npos);
}

TEST_CASE("search: one long sequence over 4 devices, ZeRO over the cp ranks, the ring's exposure",
          "[plan][cp]") {
  // Issue 34's run (perf/gpu/cp_long.sh): Llama 3.2 1B, one sequence of 32768 tokens, 4
  // devices. dp is 1, so only cp can split the work, and ZeRO shards over dp x cp: the layout
  // cp_long.sh runs (cp 4, ZeRO-1) must be among the candidates (the search used to skip every
  // ZeRO stage where dp was 1).
  const auto cal = h200();
  plan::SearchOptions o;
  o.cluster = node(4);
  o.cluster.memory_bytes = 80.0 * (1u << 30);
  o.global_batch = 1;
  o.micro_batches = {1};
  o.zero_stages = {1};
  const auto cfg = model::preset("llama3.2-1b");
  const auto r = plan::search(cfg, 32768, o, cal);
  const plan::Candidate* cp4 = nullptr;
  for (const auto& c : r.ranked)
    if (c.layout.cp == 4 && c.layout.dp == 1 && c.layout.zero_stage == 1) cp4 = &c;
  REQUIRE(cp4 != nullptr);
  // The ring's traffic: all of it and the part not hidden by the attention blocks beside it.
  REQUIRE(cp4->cost.cp_comm_total_s > 0);
  REQUIRE(cp4->cost.cp_comm_s >= 0);
  REQUIRE(cp4->cost.cp_comm_s <= cp4->cost.cp_comm_total_s);
  const std::string json = plan::candidate_json(*cp4, r);
  REQUIRE(json.find("\"cp_total\"") != std::string::npos);
  if (&r.ranked.front() == cp4)
    REQUIRE(plan::format_table(r, cfg, 32768, o, cal, 1).find("cp ring exposed") !=
            std::string::npos);
}

TEST_CASE("a layout's INI is read back by `meshtrain train`'s options", "[plan]") {
  plan::Layout l;
  l.dp = 2;
  l.pp = 2;
  l.tp = 2;
  l.zero_stage = 1;
  l.offload = true;
  l.micro_batch = 4;
  l.n_micro = 8;
  l.schedule = parallel::ScheduleKind::interleaved;
  l.virtual_chunks = 2;
  l.sequence_parallel = true;
  l.recompute = true;
  l.bucket_bytes = 50u << 20;
  const std::string path = "test_plan_model_layout.ini";
  std::ofstream(path) << plan::layout_ini(l, 256, "[model]\npreset = demo\nn_layer = 8\n");
  const auto desc = app::train_options();
  const auto p = config::parse({"--config", path}, desc);
  const auto& vm = p.vm;
  REQUIRE(vm["mesh.dp"].as<int>() == 2);
  REQUIRE(vm["mesh.pp"].as<int>() == 2);
  REQUIRE(vm["mesh.tp"].as<int>() == 2);
  REQUIRE(vm["zero.stage"].as<int>() == 1);
  REQUIRE(vm["zero.offload_optimizer"].as<std::string>() == "cpu");
  REQUIRE(vm["train.micro_batch"].as<int>() == 4);
  REQUIRE(vm["train.grad_accum"].as<int>() == 8);
  REQUIRE(vm["train.seq_len"].as<int>() == 256);
  REQUIRE(vm["train.recompute"].as<bool>());
  REQUIRE(vm["train.precision"].as<std::string>() == "fp32");
  REQUIRE(vm["pp.schedule"].as<std::string>() == "interleaved");
  REQUIRE(vm["pp.virtual_chunks"].as<int>() == 2);
  REQUIRE(vm["tp.sequence_parallel"].as<bool>());
  REQUIRE(vm["dp.bucket_mb"].as<double>() == Approx(50));
  REQUIRE(app::model_config(vm).n_layer == 8);
}

TEST_CASE("the Slurm job submits through the project's scripts when they exist", "[plan]") {
  auto cal = h200();
  plan::SearchOptions o;
  o.cluster = node(32);
  plan::Candidate c;
  c.layout.dp = 2;
  c.layout.pp = 2;
  c.layout.tp = 8;
  const std::string dir = "test_plan_model_jobs";
  std::filesystem::create_directories(dir);
  // Without the scripts: a self-contained batch script over 4 nodes of 8 GPUs.
  std::filesystem::remove(dir + "/slurm-multinode.sh");
  const std::string alone = plan::slurm_script(c, o, cal, "plan.ini", dir);
  REQUIRE(alone.find("#SBATCH --nodes=4") != std::string::npos);
  REQUIRE(alone.find("#SBATCH --gpus-per-node=8") != std::string::npos);
  REQUIRE(alone.find("meshtrain train --config plan.ini --mesh.dp 2 --mesh.pp 2 --mesh.tp 8") !=
          std::string::npos);
  // With them: sbatch of jobs/slurm-multinode.sh with the mesh and the config.
  std::ofstream(dir + "/slurm-multinode.sh") << "#!/bin/sh\n";
  const std::string via = plan::slurm_script(c, o, cal, "plan.ini", dir);
  REQUIRE(via.find("sbatch --nodes=4 --gpus-per-node=8 --ntasks-per-node=8 " + dir +
                   "/slurm-multinode.sh --dp 2 --pp 2 --tp 8 --config plan.ini") !=
          std::string::npos);
}

TEST_CASE("GPU layouts count cuDNN attention's backward buffer, in the form the kernel takes",
          "[plan][memory]") {
  // GPT-2 124M, mb 16, seq 1024, bf16 on one GPU: B NH T64^2 2 bytes = 384 MiB > 256 MiB, so the
  // default backward accumulates dQ in fp32 (our scratch: rowsum + dQ, 65 floats per row);
  // deterministic keeps dP in cuDNN's workspace (the 384 MiB seen on the H200) and rowsum only.
  const model::GptConfig cfg = model::preset("gpt2-124m");
  plan::Layout l;
  l.micro_batch = 16;
  l.precision = plan::Precision::bf16;
  plan::MemoryTarget off;
  off.device_is_host = false;
  plan::MemoryTarget on = off, det = off;
  on.cudnn_attention = det.cudnn_attention = true;
  det.deterministic_attention = true;
  const double w_off = plan::peak_memory(cfg, 1024, l, off).workspace;
  const double w_on = plan::peak_memory(cfg, 1024, l, on).workspace;
  const double w_det = plan::peak_memory(cfg, 1024, l, det).workspace;
  const double rows = 16.0 * 12 * 1024;
  REQUIRE(kernels::cudnn_attention_dq_accum_form(16, 12, 1024, false, 9));
  REQUIRE_FALSE(kernels::cudnn_attention_dq_accum_form(16, 12, 1024, true, 9));
  REQUIRE(w_on - w_off == Approx(rows * 4 * 65 + 512).epsilon(1e-12));
  REQUIRE(w_det - w_off == Approx(rows * 4 + 16.0 * 12 * 1024 * 1024 * 2 + 512).epsilon(1e-12));
  // Below 256 MiB of dP the workspace form is the default on Hopper (mb 8 at T = 1024: 192 MiB).
  REQUIRE_FALSE(kernels::cudnn_attention_dq_accum_form(8, 12, 1024, false, 9));
  // Only where cuDNN runs: fp32 models, and head sizes other than 64/128, keep our kernels.
  plan::Layout l32 = l;
  l32.precision = plan::Precision::fp32;
  REQUIRE(plan::peak_memory(cfg, 1024, l32, on).workspace ==
          plan::peak_memory(cfg, 1024, l32, off).workspace);
  model::GptConfig hs96 = cfg;
  hs96.n_head = 8;  // head size 96
  REQUIRE(plan::peak_memory(hs96, 1024, l, on).workspace ==
          plan::peak_memory(hs96, 1024, l, off).workspace);
}

TEST_CASE("GPU cp layouts count the ring attention blocks' staging in cuDNN's buffer",
          "[plan][memory][cp]") {
  // Llama 3.2 1B (32 query heads, 8 kv heads, HS 64), seq 8192 at cp 4 and tp 2: 1024 rows per
  // rank's block, 16 query and 4 kv heads per rank. Besides the self-attention-sized buffer at
  // the rank's 2048 rows, the largest block's backward stages the merged lse (fp32) and the
  // 16-bit dQ, dK, dV: 2 x 2048 x (16 x 4 + 16 x 64 x 2 + 2 x 4 x 64 x 2) bytes.
  const model::GptConfig cfg = model::preset("llama3.2-1b");
  plan::Layout l;
  l.micro_batch = 2;
  l.cp = 4;
  l.tp = 2;
  l.precision = plan::Precision::bf16;
  plan::MemoryTarget off;
  off.device_is_host = false;
  plan::MemoryTarget on = off;
  on.cudnn_attention = true;
  const double grown = plan::peak_memory(cfg, 8192, l, on).workspace -
                       plan::peak_memory(cfg, 8192, l, off).workspace;
  const double self = double(kernels::cudnn_attention_buffer_bytes(2, 16, 2048, 64, false, 9));
  const double blocks = 2.0 * 2048 * (16 * 4 + 16 * 64 * 2 + 2 * 4 * 64 * 2);
  REQUIRE(double(kernels::cudnn_attention_block_scratch_bytes(2, 16, 4, 2048, 64)) == blocks);
  REQUIRE(grown == Approx(self + blocks).epsilon(1e-12));
  // Without cp, the buffer is self-attention's alone.
  l.cp = 1;
  REQUIRE(plan::peak_memory(cfg, 8192, l, on).workspace -
              plan::peak_memory(cfg, 8192, l, off).workspace ==
          Approx(double(kernels::cudnn_attention_buffer_bytes(2, 16, 8192, 64, false, 9)))
              .epsilon(1e-12));
}
