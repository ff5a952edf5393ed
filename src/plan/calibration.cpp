#include "meshtrain/plan/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"

namespace meshtrain::plan {

double GemmPoint::intensity() const { return flops() / (2.0 * (m * k + k * n + m * n)); }

double Calibration::gemm_tflops(double m, double n, double k) const {
  if (gemm.empty()) return 1.0;
  // Inverse-distance weighting in (log FLOPs, log arithmetic intensity): a GEMM is like the
  // measured shapes nearest to it in size and in FLOPs per byte (a wide-and-thin product of
  // the same FLOPs as a square one runs slower).
  const GemmPoint q{m, n, k, 0};
  const double lf = std::log(q.flops()), li = std::log(q.intensity());
  double wsum = 0, tsum = 0;
  for (const auto& g : gemm) {
    const double df = std::log(g.flops()) - lf, di = std::log(g.intensity()) - li;
    const double d2 = df * df + di * di;
    if (d2 < 1e-12) return g.tflops;
    const double w = 1.0 / (d2 * d2);
    wsum += w;
    tsum += w * g.tflops;
  }
  return tsum / wsum;
}

namespace {
// FP8 over bf16 GEMM time at the same shape, measured by meshtrain on one H100 (2026-12-05,
// `FP8=1 perf/gpu/gemm_shapes.sh BUNDLE OUT llama8b-fp8`, perf/archive/gpu-fp8/
// h100_fp8_step_2026-12-05_kept_inputs.txt): the forward, input- and weight-gradient GEMMs of a
// Llama-3.1-8B block at 8192 rows, each gemm_fp8 beside its bf16 gemm in one run. Per shape
// tensorwise ran 1.58-1.84x (1,246-1,437 TF/s against 772-822), rowwise 1.44-1.61x; the
// figures below are the step's ratios, bf16 time over FP8 time summed over the block's GEMMs
// (the o projection's shape twice: it is also its input gradient's). The H100 and H200 share
// their tensor cores, so the ratio carries to an H200's bf16 points (8192^3 at 790 TF/s gives
// 1,327 TF/s tensorwise, inside the measured range).
constexpr double kGpuFp8SpeedupTensorwise = 1.68, kGpuFp8SpeedupRowwise = 1.54;
}  // namespace

double default_fp8_speedup(const std::string& device, bool rowwise) {
  // Host builds run FP8 GEMMs as fp32 GEMMs of the decoded codes (kernels/gemm/gemm_fp8.cpp's
  // emulation): the fp32 rate; its decode and scale passes are left out.
  if (device != "gpu") return 1.0;
  return rowwise ? kGpuFp8SpeedupRowwise : kGpuFp8SpeedupTensorwise;
}

double Calibration::fp8_speedup(bool rowwise) const {
  const double given = rowwise ? fp8_speedup_rowwise : fp8_speedup_tensorwise;
  return given > 0 ? given : default_fp8_speedup(device, rowwise);
}

double Calibration::slowdown(double busy) const {
  const auto& p = rank_slowdown;
  if (p.empty() || busy <= p.front().first) return 1.0;
  for (std::size_t i = 1; i < p.size(); ++i)
    if (busy <= p[i].first) {
      const double w = (busy - p[i - 1].first) / (p[i].first - p[i - 1].first);
      return p[i - 1].second + w * (p[i].second - p[i - 1].second);
    }
  if (p.size() == 1) return p.back().second;
  const auto &a = p[p.size() - 2], &b = p.back();  // the last segment, extended
  return b.second + (busy - b.first) * (b.second - a.second) / (b.first - a.first);
}

namespace {

double num(const Json& o, const char* key, double fallback, const std::string& what) {
  const Json* v = json::find(o, key);
  return v ? json::as_number(*v, what + ": " + key) : fallback;
}
std::string str(const Json& o, const char* key, const std::string& fallback) {
  const Json* v = json::find(o, key);
  return v && v->is_string() ? v->get<std::string>() : fallback;
}
bool flag(const Json& o, const char* key, bool fallback) {
  const Json* v = json::find(o, key);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}

LinkClass link(const Json* o, const std::string& what) {
  LinkClass l;
  if (!o) return l;
  l.alpha_us = num(*o, "alpha_us", l.alpha_us, what);
  l.busbw_gbs = num(*o, "busbw_gbs", l.busbw_gbs, what);
  l.measured = flag(*o, "measured", false);
  l.note = str(*o, "note", "");
  MESHTRAIN_CONFIG_CHECK(l.busbw_gbs > 0 && l.alpha_us >= 0, what,
                         ": busbw_gbs must be positive and alpha_us not negative");
  return l;
}

Json link_json(const LinkClass& l) {
  return {{"alpha_us", l.alpha_us}, {"busbw_gbs", l.busbw_gbs}, {"measured", l.measured},
          {"note", l.note}};
}

}  // namespace

Calibration parse_calibration(const std::string& text, const std::string& what) {
  const Json j = json::parse(text, what);
  MESHTRAIN_CONFIG_CHECK(j.is_object(), what, ": not a JSON object");
  Calibration c;
  c.machine = str(j, "machine", c.machine);
  c.source = str(j, "source", "");
  c.date = str(j, "date", "");
  c.notes = str(j, "notes", "");
  c.measured = flag(j, "measured", false);
  c.device = str(j, "device", c.device);
  MESHTRAIN_CONFIG_CHECK(c.device == "cpu" || c.device == "gpu", what, ": device '", c.device,
                         "' is not cpu or gpu");
  c.precision = str(j, "precision", c.precision);
  c.peak_tflops = num(j, "peak_tflops", 0, what);
  if (const Json* r = json::find(j, "rank_slowdown")) {
    MESHTRAIN_CONFIG_CHECK(r->is_array(), what,
                           ": rank_slowdown must be an array of [ranks, slowdown] pairs");
    c.rank_slowdown.clear();
    for (const Json& p : *r) {
      MESHTRAIN_CONFIG_CHECK(p.is_array() && p.size() == 2, what,
                             ": rank_slowdown must be an array of [ranks, slowdown] pairs");
      c.rank_slowdown.emplace_back(json::as_number(p[0], what), json::as_number(p[1], what));
      MESHTRAIN_CONFIG_CHECK(c.rank_slowdown.back().first >= 1 &&
                                 c.rank_slowdown.back().second > 0,
                             what, ": rank_slowdown needs ranks >= 1 and positive slowdowns");
    }
    std::sort(c.rank_slowdown.begin(), c.rank_slowdown.end());
    if (c.rank_slowdown.empty()) c.rank_slowdown = {{1, 1}};
  }
  if (const Json* g = json::find(j, "gemm")) {
    MESHTRAIN_CONFIG_CHECK(g->is_array(), what, ": gemm must be an array");
    for (const Json& p : *g) {
      GemmPoint pt{num(p, "m", 0, what), num(p, "n", 0, what), num(p, "k", 0, what),
                   num(p, "tflops", 0, what)};
      MESHTRAIN_CONFIG_CHECK(pt.flops() > 0 && pt.tflops > 0, what,
                             ": every gemm point needs positive m, n, k and tflops");
      c.gemm.push_back(pt);
    }
  }
  if (const Json* a = json::find(j, "attention")) {
    c.attention_fwd_tflops = num(*a, "fwd_tflops", c.attention_fwd_tflops, what);
    c.attention_bwd_tflops = num(*a, "bwd_tflops", c.attention_bwd_tflops, what);
  }
  if (const Json* f = json::find(j, "fp8_gemm_speedup")) {  // older files: the default
    c.fp8_speedup_tensorwise = num(*f, "tensorwise", 0, what + ": fp8_gemm_speedup");
    c.fp8_speedup_rowwise = num(*f, "rowwise", 0, what + ": fp8_gemm_speedup");
    MESHTRAIN_CONFIG_CHECK(c.fp8_speedup_tensorwise >= 0 && c.fp8_speedup_rowwise >= 0, what,
                           ": fp8_gemm_speedup must not be negative (0: the default)");
  }
  c.memory_gbs = num(j, "memory_gbs", c.memory_gbs, what);
  if (const Json* k = json::find(j, "kernels_gbs")) {
    c.elementwise_gbs = num(*k, "elementwise", c.elementwise_gbs, what);
    c.gelu_gbs = num(*k, "gelu", c.gelu_gbs, what);
    c.layernorm_gbs = num(*k, "layernorm", c.layernorm_gbs, what);
    c.cross_entropy_gbs = num(*k, "cross_entropy", c.cross_entropy_gbs, what);
    c.adamw_gbs = num(*k, "adamw", c.adamw_gbs, what);
    c.host_adamw_gbs = num(*k, "host_adamw", c.host_adamw_gbs, what);
  }
  c.pcie_gbs = num(j, "pcie_gbs", c.pcie_gbs, what);
  c.kernel_overhead_us = num(j, "kernel_overhead_us", 0, what);
  c.step_overhead_ms = num(j, "step_overhead_ms", 0, what);
  c.dp_overlap = std::clamp(num(j, "dp_overlap", 1, what), 0.0, 1.0);
  c.runtime_bytes = num(j, "runtime_bytes", 0, what);
  c.device_memory_gib = num(j, "device_memory_gib", 0, what);
  c.probe_alone_s = num(j, "probe_alone_s", 0, what);
  c.usable_memory_fraction = num(j, "usable_memory_fraction", 0.95, what);
  if (const Json* l = json::find(j, "links")) {
    c.intra = link(json::find(*l, "intra"), what + ": links.intra");
    c.inter = link(json::find(*l, "inter"), what + ": links.inter");
  }
  if (const Json* s = json::find(j, "scale")) {
    c.scale_compute = num(*s, "compute", 1, what);
    c.scale_comm = num(*s, "comm", 1, what);
    c.validated_layouts = static_cast<int>(num(*s, "validated_layouts", 0, what));
  }
  for (double v : {c.attention_fwd_tflops, c.attention_bwd_tflops, c.memory_gbs,
                   c.elementwise_gbs, c.gelu_gbs, c.layernorm_gbs, c.cross_entropy_gbs,
                   c.adamw_gbs, c.host_adamw_gbs, c.pcie_gbs, c.scale_compute, c.scale_comm})
    MESHTRAIN_CONFIG_CHECK(v > 0, what, ": throughputs, bandwidths and scales must be positive");
  return c;
}

Calibration load_calibration(const std::string& path) {
  std::ifstream in(path);
  MESHTRAIN_CONFIG_CHECK(in.good(), "calibration file '", path,
                         "' (plan.calibration) cannot be opened; `meshtrain bench` writes one");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_calibration(ss.str(), path);
}

std::string to_json(const Calibration& c) {
  Json o = Json::object();
  o["format"] = 1;
  o["machine"] = c.machine;
  o["measured"] = c.measured;
  o["source"] = c.source;
  o["date"] = c.date;
  o["notes"] = c.notes;
  o["device"] = c.device;
  o["precision"] = c.precision;
  o["peak_tflops"] = c.peak_tflops;
  Json& slowdown = o["rank_slowdown"] = Json::array();
  for (const auto& [ranks, factor] : c.rank_slowdown) slowdown.push_back({ranks, factor});
  Json& gemm = o["gemm"] = Json::array();
  for (const GemmPoint& g : c.gemm)
    gemm.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"tflops", g.tflops}});
  o["attention"] = {{"fwd_tflops", c.attention_fwd_tflops}, {"bwd_tflops", c.attention_bwd_tflops}};
  o["fp8_gemm_speedup"] = {{"tensorwise", c.fp8_speedup(false)}, {"rowwise", c.fp8_speedup(true)}};
  o["memory_gbs"] = c.memory_gbs;
  o["kernels_gbs"] = {{"elementwise", c.elementwise_gbs}, {"gelu", c.gelu_gbs},
                      {"layernorm", c.layernorm_gbs},     {"cross_entropy", c.cross_entropy_gbs},
                      {"adamw", c.adamw_gbs},             {"host_adamw", c.host_adamw_gbs}};
  o["pcie_gbs"] = c.pcie_gbs;
  o["kernel_overhead_us"] = c.kernel_overhead_us;
  o["step_overhead_ms"] = c.step_overhead_ms;
  o["dp_overlap"] = c.dp_overlap;
  o["runtime_bytes"] = c.runtime_bytes;
  o["device_memory_gib"] = c.device_memory_gib;
  o["probe_alone_s"] = c.probe_alone_s;
  o["usable_memory_fraction"] = c.usable_memory_fraction;
  o["links"] = {{"intra", link_json(c.intra)}, {"inter", link_json(c.inter)}};
  o["scale"] = {{"compute", c.scale_compute}, {"comm", c.scale_comm},
                {"validated_layouts", c.validated_layouts}};
  // Six significant digits: measurements are not more precise than that; one GEMM point and
  // one link class per line.
  return json::dump(o, {100, 6, 2}) + "\n";
}

void save_calibration(const std::string& path, const Calibration& c) {
  std::ofstream out(path);
  MESHTRAIN_CONFIG_CHECK(out.good(), "cannot write the calibration file '", path, "'");
  out << to_json(c);
}

}  // namespace meshtrain::plan
