#include "meshtrain/app/subcommand_table.hpp"

#include "meshtrain/app/convert.hpp"
#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/app/doctor.hpp"
#include "meshtrain/app/bench_cmd.hpp"
#include "meshtrain/app/plan_cmd.hpp"
#include "meshtrain/app/prep.hpp"
#include "meshtrain/app/selfcheck.hpp"
#include "meshtrain/app/train_cmd.hpp"

namespace meshtrain::app {

const std::vector<Subcommand>& subcommand_table() {
  static const std::vector<Subcommand> table = {
      {"selfcheck", "check the process mesh and every collective on every sub-communicator",
       selfcheck_options, cmd_selfcheck},
      {"train", "train a GPT model on token shards (progress, eval, HF export, a sample)",
       train_options, cmd_train},
      {"generate", "sample text from a trained model (HuggingFace folder)", generate_options,
       cmd_generate},
      {"prep", "tokenise raw text into token shards (rank 0 only; mpirun not needed)",
       prep_options, cmd_prep},
      {"convert", "export a training checkpoint's model as a HuggingFace folder (safetensors)",
       convert_options, cmd_convert},
      {"plan", "predict memory and step time of every layout for a model and cluster, rank them, "
               "write the chosen one's config and Slurm job, validate on this job",
       plan_options, cmd_plan},
      {"config", "print the INI equivalent of the options given (--deepspeed ds_config.json, "
                 "--config, the command line) for `train --config`",
       config_cmd_options, cmd_config},
      {"doctor", "read a run's folder (metrics, configuration, flight dumps) and say what "
                 "slows or breaks it, in the seeds' troubleshooting terms, against the planner's "
                 "prediction", doctor_options, cmd_doctor},
      {"bench", "measure the planner's calibration on this machine (GEMM, attention, memory, "
                "collectives) into a JSON file", bench_options, cmd_bench},
  };
  return table;
}

const Subcommand* find_subcommand(const std::string& name) {
  for (const auto& s : subcommand_table())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace meshtrain::app
