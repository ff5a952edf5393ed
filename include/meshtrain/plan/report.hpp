#pragma once
// What `meshtrain plan` prints and writes: the ranked table, JSON for scripts, the INI of a
// layout that `meshtrain train --config` reads, and a Slurm job script for it.
#include <string>

#include "meshtrain/plan/search.hpp"

namespace meshtrain::plan {

// Header (model, cluster, calibration, scenario and its rule) and the top `top` layouts.
std::string format_table(const SearchResult& r, const model::GptConfig& cfg, int seq_len,
                         const SearchOptions& opt, const Calibration& cal, int top);
std::string to_json(const SearchResult& r, const model::GptConfig& cfg, int seq_len,
                    const SearchOptions& opt, const Calibration& cal, int top);
// One candidate as a JSON object (also used by the validation report).
std::string candidate_json(const Candidate& c, const SearchResult& r);

// [mesh] [pp] [tp] [zero] [dp] [train] sections of the layout; `model_section` (the [model]
// lines of the planned model) is written first.
std::string layout_ini(const Layout& l, int seq_len, const std::string& model_section);

// A Slurm job for the layout. When `jobs_dir` holds the project's Slurm scripts
// (slurm-gpu.sh, slurm-multinode.sh, slurm-cpu.sh) the job submits through them with --dp/--pp/
// --tp and the config file; otherwise it is a self-contained batch script running
// `srun meshtrain train --config <config_path>`.
std::string slurm_script(const Candidate& c, const SearchOptions& opt, const Calibration& cal,
                         const std::string& config_path, const std::string& jobs_dir);

}  // namespace meshtrain::plan
