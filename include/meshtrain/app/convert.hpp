#pragma once
// `meshtrain convert`: the model weights of a training checkpoint as a HuggingFace folder
// (model.safetensors + config.json), which `meshtrain generate` and `transformers` load.
#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {

boost::program_options::options_description convert_options();
int cmd_convert(Runtime& rt, const std::vector<std::string>& args);

// The value of `key` in section `section` of an INI text (the resolved configuration a
// checkpoint stores), or "" when absent.
std::string ini_value(const std::string& text, const std::string& section, const std::string& key);

}  // namespace meshtrain::app
