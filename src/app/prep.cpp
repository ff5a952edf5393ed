// `meshtrain prep`: tokenises raw text into llm.c token shards. It is a serial job (one file read
// front to back), so rank 0 does all of it and the other ranks of an mpirun wait for its status;
// without mpirun it runs as an MPI singleton.
#include "meshtrain/app/prep.hpp"

#include <glob.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/app/options.hpp"
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/io/tokenizer.hpp"

namespace meshtrain::app {

namespace fs = std::filesystem;

po::options_description prep_options() {
  po::options_description d;
  d.add(config::generic_options()).add(log_options());
  po::options_description p("Data preparation [prep]");
  p.add_options()
      ("prep.input", po::value<std::vector<std::string>>(),
       "UTF-8 text file(s) to tokenise, in order; repeat the option or give a comma list")
      ("prep.output", po::value<std::string>(),
       "output prefix: writes <prefix>_train_000000.bin ... and <prefix>_val_000000.bin")
      ("prep.tokenizer", po::value<std::string>()->default_value("byte"),
       "byte (vocab 256), gpt2 (needs prep.vocab_json and prep.merges_txt) or hf (needs "
       "prep.tokenizer_json)")
      ("prep.tokenizer_json", po::value<std::string>()->default_value(""),
       "HuggingFace tokenizer.json, or a folder holding one (prep.tokenizer = hf)")
      ("prep.document_start", po::value<std::string>()->default_value(""),
       "PCRE2 regex; a line that matches it starts a new document, e.g. "
       "'^(?:[12] )?[A-Z][a-z]+ 1$' for the books of inputs/kjv.txt. Empty: each input file "
       "is one document")
      ("prep.bos", po::value<bool>()->default_value(false)->implicit_value(true),
       "hf: put the tokenizer's BOS token before each document")
      ("prep.eos", po::value<bool>()->default_value(true)->implicit_value(true),
       "hf: put the tokenizer's EOS token after each document")
      ("prep.bos_token", po::value<std::string>()->default_value(""),
       "hf: the BOS token's text (default: tokenizer_config.json's bos_token, else the first "
       "token of the tokenizer's template)")
      ("prep.eos_token", po::value<std::string>()->default_value(""),
       "hf: the EOS token's text (default: tokenizer_config.json's eos_token, else the first of "
       "<|end_of_text|>, <|endoftext|>, </s>, <eos> in the tokenizer)")
      ("prep.vocab_json", po::value<std::string>()->default_value(""),
       "HuggingFace GPT-2 vocab.json (prep.tokenizer = gpt2)")
      ("prep.merges_txt", po::value<std::string>()->default_value(""),
       "HuggingFace GPT-2 merges.txt (prep.tokenizer = gpt2)")
      ("prep.val_fraction", po::value<double>()->default_value(0.05, "0.05"),
       "fraction of the tokens, taken from the end of the text, written as validation data")
      ("prep.shard_tokens", po::value<std::int64_t>()->default_value(100'000'000),
       "maximum tokens per shard file");
  d.add(p);
  return d;
}

PrepConfig prep_config(const po::variables_map& vm) {
  PrepConfig c;
  if (vm.count("prep.input")) {
    for (const auto& v : vm["prep.input"].as<std::vector<std::string>>()) {
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ','))
        if (!item.empty()) c.inputs.push_back(item);
    }
  }
  if (c.inputs.empty())
    throw ConfigError("prep.input is required: the text file(s) to tokenise (see --help)");
  if (!vm.count("prep.output") || vm["prep.output"].as<std::string>().empty())
    throw ConfigError("prep.output is required: the shard prefix, e.g. inputs/data/kjv");
  c.output = vm["prep.output"].as<std::string>();
  c.tokenizer = vm["prep.tokenizer"].as<std::string>();
  c.vocab_json = vm["prep.vocab_json"].as<std::string>();
  c.merges_txt = vm["prep.merges_txt"].as<std::string>();
  c.tokenizer_json = vm["prep.tokenizer_json"].as<std::string>();
  c.document_start = vm["prep.document_start"].as<std::string>();
  c.add_bos = vm["prep.bos"].as<bool>();
  c.add_eos = vm["prep.eos"].as<bool>();
  c.bos_token = vm["prep.bos_token"].as<std::string>();
  c.eos_token = vm["prep.eos_token"].as<std::string>();
  c.val_fraction = vm["prep.val_fraction"].as<double>();
  c.shard_tokens = vm["prep.shard_tokens"].as<std::int64_t>();
  if (c.tokenizer != "byte" && c.tokenizer != "gpt2" && c.tokenizer != "hf")
    throw ConfigError(cat("prep.tokenizer='", c.tokenizer, "' is not one of byte, gpt2, hf"));
  if (c.tokenizer == "gpt2" && (c.vocab_json.empty() || c.merges_txt.empty()))
    throw ConfigError("prep.tokenizer=gpt2 needs prep.vocab_json and prep.merges_txt");
  if (c.tokenizer == "hf" && c.tokenizer_json.empty())
    throw ConfigError(
        "prep.tokenizer=hf needs prep.tokenizer_json (a tokenizer.json or its folder)");
  if (!(c.val_fraction >= 0 && c.val_fraction < 1))
    throw ConfigError(cat("prep.val_fraction=", c.val_fraction, " must be in [0, 1)"));
  if (c.shard_tokens <= 0 || c.shard_tokens > INT32_MAX)
    throw ConfigError(cat("prep.shard_tokens=", c.shard_tokens, " must be in [1, 2^31 - 1]"));
  return c;
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(cat("prep.input: cannot open '", path, "': ", std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(cat("prep.input: read error in '", path, "'"));
  return ss.str();
}

std::string shard_name(const std::string& prefix, const char* split, std::size_t i) {
  char num[16];
  std::snprintf(num, sizeof num, "%06zu", i);
  return cat(prefix, "_", split, "_", num, ".bin");
}

// The shards of a split that exist now (an earlier run's).
std::vector<std::string> existing_shards(const std::string& prefix, const char* split) {
  std::vector<std::string> out;
  glob_t g{};
  const std::string pat = cat(prefix, "_", split, "_[0-9][0-9][0-9][0-9][0-9][0-9].bin");
  if (::glob(pat.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

constexpr const char* kNewSuffix = ".new";

// Writes a split's shards as <name>.new files; returns the final names.
std::vector<std::string> write_split(const std::string& prefix, const char* split,
                                     const std::uint16_t* tokens, std::size_t n,
                                     std::size_t per_shard) {
  std::vector<std::string> files;
  std::size_t i = 0;
  do {  // at least one file, even for an empty split, so the name in the config always exists
    const std::size_t m = std::min(per_shard, n - i);
    files.push_back(shard_name(prefix, split, files.size()));
    io::write_shard(files.back() + kNewSuffix,
                    std::vector<std::uint16_t>(tokens + i, tokens + i + m));
    i += m;
  } while (i < n);
  return files;
}

// The earlier shards stay untouched until every new one is on disk: then the new ones replace
// them (a rename each), and earlier shards beyond the new count (a re-run with a larger
// prep.shard_tokens writes fewer files) are removed, or the training glob would pick them up.
// A failure before that removes the new files and leaves the earlier data as it was.
void commit_shards(const std::vector<std::pair<std::string, std::vector<std::string>>>& splits,
                   const std::string& prefix) {
  for (const auto& [split, files] : splits) {
    for (const auto& f : files) {
      std::error_code ec;
      fs::rename(f + kNewSuffix, f, ec);
      if (ec)
        throw ConfigError(cat("prep.output: cannot rename '", f, kNewSuffix, "' to '", f, "': ",
                              ec.message()));
    }
    for (const auto& old : existing_shards(prefix, split.c_str()))
      if (std::find(files.begin(), files.end(), old) == files.end()) {
        logging::info("prep: removing the earlier shard ", old);
        std::remove(old.c_str());
      }
  }
}


}  // namespace

PrepSummary run_prep(const PrepConfig& c) {
  const std::unique_ptr<io::Tokenizer> tok =
      c.tokenizer == "hf"
          ? std::make_unique<io::HfTokenizer>(c.tokenizer_json, c.bos_token, c.eos_token)
          : io::make_tokenizer(c.tokenizer, c.vocab_json, c.merges_txt);
  // Separators around each document. GPT-2 (llm.c's convention): <|endoftext|> before each, so
  // the model learns where documents begin; hf: the tokenizer's BOS before (prep.bos) and EOS
  // after (prep.eos); the byte tokenizer has no such tokens and just concatenates.
  int before = -1, after = -1;
  if (c.tokenizer == "gpt2") before = tok->eot();
  if (c.tokenizer == "hf") {
    const std::string& file = static_cast<const io::HfTokenizer&>(*tok).path();
    if (c.add_bos && tok->bos() < 0)
      throw ConfigError(cat("prep.bos: the tokenizer ", file, " has no BOS token; name one with "
                            "prep.bos_token"));
    if (c.add_eos && tok->eot() < 0)
      throw ConfigError(cat("prep.eos: the tokenizer ", file, " has no EOS token that meshtrain "
                            "recognises; name one with prep.eos_token (or set prep.eos=false)"));
    before = c.add_bos ? tok->bos() : -1;
    after = c.add_eos ? tok->eot() : -1;
  }
  // Shards store uint16 tokens: ids 0..65535.
  if (tok->vocab_size() > 65536)
    throw ConfigError(cat("prep.tokenizer=", c.tokenizer, ": the vocabulary has ", tok->vocab_size(),
                          " ids but token shards store uint16 (at most 65536 ids)",
                          c.vocab_json.empty() ? "" : cat(" (", c.vocab_json, ")"),
                          c.tokenizer_json.empty() ? "" : cat(" (", c.tokenizer_json, ")")));
  PrepSummary s;
  s.tokenizer = tok->name();
  s.vocab_size = tok->vocab_size();
  std::vector<std::uint16_t> tokens;
  for (const auto& path : c.inputs) {
    const std::string text = read_text(path);
    s.input_bytes += text.size();
    for (std::string_view doc :
         io::split_documents(text, c.document_start, "prep.document_start")) {
      ++s.documents;
      if (before >= 0) tokens.push_back(static_cast<std::uint16_t>(before));
      for (std::int32_t t : tok->encode(doc)) tokens.push_back(static_cast<std::uint16_t>(t));
      if (after >= 0) tokens.push_back(static_cast<std::uint16_t>(after));
    }
  }
  if (s.input_bytes == 0) throw ConfigError("prep.input: the input files are empty");
  const std::size_t n = tokens.size();
  const auto n_val = static_cast<std::size_t>(std::llround(static_cast<double>(n) * c.val_fraction));
  const std::size_t n_train = n - n_val;
  if (n_train == 0)
    throw ConfigError(cat("prep.val_fraction=", c.val_fraction, " leaves none of the ", n,
                          " tokens for training"));
  const fs::path parent = fs::path(c.output).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec)
      throw ConfigError(cat("prep.output: cannot create the directory '", parent.string(), "': ",
                            ec.message()));
  }
  const auto per_shard = static_cast<std::size_t>(c.shard_tokens);
  try {
    s.train_files = write_split(c.output, "train", tokens.data(), n_train, per_shard);
    s.train_tokens = n_train;
    if (c.val_fraction > 0) {
      s.val_files = write_split(c.output, "val", tokens.data() + n_train, n_val, per_shard);
      s.val_tokens = n_val;
    }
  } catch (...) {
    // Nothing of this run stays behind; the earlier shards were not touched.
    for (const char* split : {"train", "val"})
      for (std::size_t i = 0;; ++i) {
        const std::string f = shard_name(c.output, split, i) + kNewSuffix;
        if (!fs::exists(f)) break;
        std::remove(f.c_str());
      }
    throw;
  }
  commit_shards({{"train", s.train_files}, {"val", s.val_files}}, c.output);
  return s;
}

int cmd_prep(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = prep_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  const PrepConfig c = prep_config(p.vm);  // every rank: same options, same verdict

  // Rank 0 writes the shards; the others learn the outcome: when rank 0 fails, every rank throws
  // its error (a ConfigError: every rank exits 2 and rank 0 prints it once).
  agree_on_root(rt.world(), "", [&] {
    const PrepSummary s = run_prep(c);
    auto list = [](const std::vector<std::string>& f) {
      std::string out;
      for (const auto& x : f) out += cat(out.empty() ? "" : ", ", x);
      return out;
    };
    logging::info("prep: ", c.inputs.size(), " input file(s), ", s.input_bytes, " bytes, ",
                  s.documents, " document(s); tokenizer ", s.tokenizer, " (vocab ",
                  s.vocab_size, ")");
    logging::info("prep: train ", s.train_tokens, " tokens in ", s.train_files.size(),
                  " shard(s): ", list(s.train_files));
    if (!s.val_files.empty())
      logging::info("prep: val ", s.val_tokens, " tokens in ", s.val_files.size(),
                    " shard(s): ", list(s.val_files));
  });
  return kExitOk;
}

}  // namespace meshtrain::app
