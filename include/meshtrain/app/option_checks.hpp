#pragma once
// Range checks of option values (issue 17): a value outside its domain is a ConfigError naming
// the option, the value and the domain, before anything runs. NaN fails every check.
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {

namespace po = boost::program_options;

// `meshtrain train`: learning rates, AdamW's betas and epsilon, warmup, decay, clipping,
// batch shape, evaluation, logging, loss scaling, sampling, the divergence policy.
void check_train_options(const po::variables_map& vm);

// `meshtrain plan`: every option of the planner.
void check_plan_options(const po::variables_map& vm);

}  // namespace meshtrain::app
