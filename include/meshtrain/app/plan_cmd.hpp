#pragma once
// `meshtrain plan`: memory and step-time predictions for every layout the model and cluster
// allow, ranked; INI and Slurm output for the chosen one; validation against real runs on the
// current allocation (plan_validate.cpp).
#include <string>
#include <vector>

#include <mpi.h>

#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/plan/search.hpp"

namespace meshtrain::app {

boost::program_options::options_description plan_options();
int cmd_plan(Runtime& rt, const std::vector<std::string>& args);

struct ValidationRow {
  plan::Candidate predicted;
  double measured_step_s = 0, measured_memory = 0;  // median step; the largest rank's peak
  // CPU calibrations: the machine's speed now relative to when it was calibrated, and how much
  // this job's ranks slow each other now (probe_machine right before the run). The prediction
  // times this factor is the load-corrected prediction; 1 on GPUs.
  double load_factor = 1;
};

// Runs each candidate for `steps` steps on `world` (random tokens unless `data` names token
// shards), prints predicted vs measured step time and memory (rank 0), and returns the rows.
// On a CPU calibration each run is preceded by a machine probe, and the table also shows the
// prediction corrected for the load of other jobs on a shared machine.
std::vector<ValidationRow> validate_layouts(MPI_Comm world, const model::GptConfig& cfg,
                                            int seq_len, const std::vector<plan::Candidate>& c,
                                            const plan::SearchOptions& opt,
                                            const plan::Calibration& cal, int steps,
                                            const std::string& data);

double median_of(std::vector<double> v);

// New scale factors (compute, comm) that fit the measured step times: least squares of
// measured = a x (compute-bound part) + b x (communication part) over the rows, each factor
// clamped to [0.2, 5] times its old value; one common factor when the rows cannot separate them.
void refit_scales(const std::vector<ValidationRow>& rows, plan::Calibration& cal);

}  // namespace meshtrain::app
