#pragma once
// `meshtrain prep`: raw UTF-8 text -> llm.c token shards (<prefix>_train_NNNNNN.bin,
// <prefix>_val_NNNNNN.bin). The work is a library function so tests need not run the executable.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {

boost::program_options::options_description prep_options();

struct PrepConfig {
  std::vector<std::string> inputs;  // text files, in order
  std::string output;               // prefix, e.g. inputs/data/kjv
  std::string tokenizer = "byte";   // byte | gpt2 | hf
  std::string vocab_json, merges_txt;
  std::string tokenizer_json;       // hf: tokenizer.json or a folder with one
  // A line matching this PCRE2 regex starts a document; empty: each input file is one.
  std::string document_start;
  // hf: BOS before / EOS after each document, and the tokens' texts ("" = the tokenizer's).
  bool add_bos = false, add_eos = true;
  std::string bos_token, eos_token;
  double val_fraction = 0.05;  // the last fraction of the tokens goes to validation
  std::int64_t shard_tokens = 100'000'000;
};

struct PrepSummary {
  std::string tokenizer;
  int vocab_size = 0;
  std::uint64_t input_bytes = 0, documents = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_files, val_files;
};

// Reads and validates the [prep] options; ConfigError naming the option.
PrepConfig prep_config(const boost::program_options::variables_map& vm);
// Tokenises the inputs and writes the shards; ConfigError naming the option or file.
PrepSummary run_prep(const PrepConfig& c);

int cmd_prep(Runtime& rt, const std::vector<std::string>& args);

}  // namespace meshtrain::app
