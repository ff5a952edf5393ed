#pragma once
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/fp8_recipe.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::app {
boost::program_options::options_description model_options();  // [model]
boost::program_options::options_description train_options();  // everything `train` takes
boost::program_options::options_description fp8_options();    // [fp8], train's and plan's
boost::program_options::options_description generate_options();
// The model configuration from [model] (preset, overrides, or model.init_from's config.json).
model::GptConfig model_config(const boost::program_options::variables_map& vm);
// The trainer's configuration from train.*, ckpt.* and profile.* (ConfigError naming the option).
train::TrainConfig train_config(const boost::program_options::variables_map& vm,
                                const model::GptConfig& mc);
// train.precision=fp8's recipe from fp8.* (disabled for other precisions, where any fp8.*
// option is a ConfigError naming it). `precision_option`: the option that says fp8 (plan's
// plan.precision).
model::Fp8Recipe fp8_recipe(const boost::program_options::variables_map& vm,
                            const model::GptConfig& mc,
                            const char* precision_option = "train.precision");
// The type of the model's parameters and activations for train.precision: fp8's is bf16 on GPU
// builds with bf16 and fp32 on host builds; the others are themselves. What the planner counts.
std::string model_precision(const std::string& precision);
io::Transfer parse_transfer(const std::string& s);  // ckpt.io
int cmd_train(Runtime& rt, const std::vector<std::string>& args);
int cmd_generate(Runtime& rt, const std::vector<std::string>& args);
}  // namespace meshtrain::app
