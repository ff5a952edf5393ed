#pragma once
// `meshtrain prep`: raw UTF-8 text or JSON lines (plain, gzip or zstd) -> llm.c token shards
// (<prefix>_train_NNNNNN.bin, <prefix>_val_NNNNNN.bin), tokenised in parallel over MPI ranks
// with the same bytes for any rank count. The work is a library function so tests need not run
// the executable.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {

boost::program_options::options_description prep_options();

struct PrepConfig {
  // Text files, or JSON-lines files (.jsonl, .ndjson, .json; each may end in .gz or .zst), in
  // order. A JSON line is one document: the string member `text_field` of its object.
  std::vector<std::string> inputs;
  std::string text_field = "text";
  bool strict = false;      // a malformed JSON line is an error (exit 2), not a skipped line
  bool doc_index = false;   // write <shard>.docs (io/token_shard.hpp) next to each shard
  double progress_every = 10;  // seconds between progress lines on rank 0; 0 = none
  // Bytes of an uncompressed file that one rank takes at a time; 0 = by the input size and the
  // rank count (1 to 256 MiB). The output does not depend on it (tests set it small).
  std::uint64_t chunk_bytes = 0;
  std::string output;               // prefix, e.g. inputs/data/kjv
  std::string tokenizer = "byte";   // byte | gpt2 | hf
  std::string vocab_json, merges_txt;
  std::string tokenizer_json;       // hf: tokenizer.json or a folder with one
  // Text inputs: a line matching this PCRE2 regex starts a document; empty: each file is one.
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
  // input_bytes: the files as stored; text_bytes: after decompression (the JSON lines, or the
  // text of the documents).
  std::uint64_t input_bytes = 0, text_bytes = 0, documents = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_files, val_files;
  std::vector<std::string> doc_index_files;  // prep.doc_index: one per shard, in shard order
  // JSON lines read, and those skipped, by reason (io::JsonLineStatus); listed in skipped_report.
  std::uint64_t json_lines = 0, skipped_lines = 0;
  std::uint64_t skipped_by_status[8] = {};
  std::string skipped_report;  // <prefix>_skipped_lines.txt when lines were skipped
  std::vector<std::string> first_skipped;  // "file:line: reason" of the first few
  int ranks = 1, units = 0;
  double seconds = 0, tokenize_seconds = 0;
  // CPU seconds the ranks spent on their units: the busiest rank's and all ranks' together
  // (sum / max is the speed-up the ranks would reach on cores of their own).
  double tokenize_cpu_max = 0, tokenize_cpu_sum = 0;
};

// Reads and validates the [prep] options; ConfigError naming the option.
PrepConfig prep_config(const boost::program_options::variables_map& vm);
// Tokenises the inputs and writes the shards. Collective over `comm`: its ranks share the files
// (whole compressed files, line-aligned byte ranges of plain ones) and write their tokens in
// place; every rank returns the same summary. ConfigError (agreed: on every rank) naming the
// option, the file and, for a malformed JSON line under prep.strict, its line.
PrepSummary run_prep(const PrepConfig& c, MPI_Comm comm = MPI_COMM_SELF);

int cmd_prep(Runtime& rt, const std::vector<std::string>& args);

}  // namespace meshtrain::app
