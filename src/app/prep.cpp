// `meshtrain prep`: tokenises text and JSON-lines corpora into llm.c token shards, over every
// rank of the job (jobs/local.sh -n 8 prep ..., or a Slurm job); without mpirun it runs as an
// MPI singleton. The steps are in src/app/prep_*.cpp (prep_internal.hpp lists them).
#include "meshtrain/app/prep.hpp"

#include <glob.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>

#include "meshtrain/app/options.hpp"
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/io/tokenizer.hpp"
#include "prep_internal.hpp"

namespace meshtrain::app {

po::options_description prep_options() {
  po::options_description d;
  d.add(config::generic_options()).add(log_options());
  po::options_description p("Data preparation [prep]");
  p.add_options()
      ("prep.input", po::value<std::vector<std::string>>(),
       "file(s) to tokenise, in order; repeat the option, give a comma list or a quoted glob "
       "(its files in sorted order). UTF-8 text, or "
       "JSON lines (.jsonl, .ndjson, .json: one document per line); either may be compressed "
       "(.gz, .zst)")
      ("prep.text_field", po::value<std::string>()->default_value("text"),
       "JSON lines: the member of each line's object that holds the document")
      ("prep.strict", po::value<bool>()->default_value(false)->implicit_value(true),
       "JSON lines: a line that is not JSON, has no prep.text_field or whose field is not a "
       "string stops the job (exit 2, naming file:line); default: such lines are skipped, "
       "counted and listed in <prefix>_skipped_lines.txt")
      ("prep.doc_index", po::value<bool>()->default_value(false)->implicit_value(true),
       "also write <shard>.docs beside each shard: the token offsets where documents start "
       "(README, 'Data')")
      ("prep.progress_every", po::value<double>()->default_value(10.0, "10"),
       "seconds between progress lines (MB/s, documents, tokens, ETA); 0 = none")
      ("prep.output", po::value<std::string>(),
       "output prefix: writes <prefix>_train_000000.bin ... and <prefix>_val_000000.bin")
      ("prep.tokenizer", po::value<std::string>()->default_value("byte"),
       "byte (vocab 256), gpt2 (needs prep.vocab_json and prep.merges_txt) or hf (needs "
       "prep.tokenizer_json)")
      ("prep.tokenizer_json", po::value<std::string>()->default_value(""),
       "HuggingFace tokenizer.json, or a folder holding one (prep.tokenizer = hf)")
      ("prep.document_start", po::value<std::string>()->default_value(""),
       "text inputs: a PCRE2 regex; a line that matches it starts a new document, e.g. "
       "'^(?:[12] )?[A-Z][a-z]+ 1$' for the books of inputs/kjv.txt. Empty: each text file "
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
      while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        if (item.find_first_of("*?[") == std::string::npos) {
          c.inputs.push_back(item);
          continue;
        }
        // A glob: hundreds of corpus files, in sorted order (the output's order).
        glob_t g{};
        const int rc = ::glob(item.c_str(), 0, nullptr, &g);
        std::vector<std::string> found;
        for (std::size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) found.emplace_back(g.gl_pathv[i]);
        ::globfree(&g);
        if (found.empty())
          throw ConfigError(cat("prep.input: no file matches '", item, "'"));
        std::sort(found.begin(), found.end());
        c.inputs.insert(c.inputs.end(), found.begin(), found.end());
      }
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
  c.text_field = vm["prep.text_field"].as<std::string>();
  c.strict = vm["prep.strict"].as<bool>();
  c.doc_index = vm["prep.doc_index"].as<bool>();
  c.progress_every = vm["prep.progress_every"].as<double>();
  if (!(c.progress_every >= 0))
    throw ConfigError(cat("prep.progress_every=", c.progress_every,
                          " must be 0 (no progress lines) or a number of seconds"));
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

// CPU time of this process: what a rank spent on its units, whatever else shares the cores.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

using prep::Unit;
using prep::UnitOutput;
using prep::UnitSummary;

UnitSummary summarize(const UnitOutput& o) {
  UnitSummary u;
  u.tokens = o.tokens.size();
  u.documents = o.documents;
  u.with_tokens = o.doc_starts.size();
  u.lines = o.lines;
  u.text_bytes = o.text_bytes;
  u.skipped = o.skipped.size();
  u.complete = o.complete ? 1 : 0;
  for (const auto& l : o.skipped) ++u.skipped_by_status[static_cast<int>(l.status)];
  if (!o.skipped.empty()) {
    u.first_skipped_line = o.skipped.front().line;
    u.first_skipped_status = static_cast<std::int32_t>(o.skipped.front().status);
    std::snprintf(u.first_skipped_detail, sizeof u.first_skipped_detail, "%s",
                  o.skipped.front().detail.c_str());
  }
  return u;
}

// Every unit's summary on every rank: each rank sends those of its units, in unit order.
std::vector<UnitSummary> all_gather(MPI_Comm comm, const std::vector<Unit>& units,
                                    const std::vector<UnitOutput>& outputs) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<UnitSummary> send;
  for (const auto& o : outputs) send.push_back(summarize(o));
  std::vector<int> counts(static_cast<std::size_t>(size), 0), displs(counts.size(), 0);
  for (const Unit& u : units) counts[static_cast<std::size_t>(u.rank)] += sizeof(UnitSummary);
  for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<UnitSummary> by_rank(units.size());
  MESHTRAIN_MPI_CHECK(MPI_Allgatherv(send.data(), static_cast<int>(send.size() * sizeof(UnitSummary)),
                                     MPI_BYTE, by_rank.data(), counts.data(), displs.data(),
                                     MPI_BYTE, comm));
  // by_rank holds rank 0's units in order, then rank 1's, ...: back to unit order.
  std::vector<std::size_t> next(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) next[r] = static_cast<std::size_t>(displs[r]) / sizeof(UnitSummary);
  std::vector<UnitSummary> out(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) out[u] = by_rank[next[static_cast<std::size_t>(units[u].rank)]++];
  return out;
}

}  // namespace

PrepSummary run_prep(const PrepConfig& c, MPI_Comm comm) {
  const Timer clock;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  PrepSummary s;
  s.ranks = size;
  // Every rank reads the tokenizer and checks the inputs: the same files give the same verdict,
  // a file one node cannot see is named with its rank.
  std::unique_ptr<io::Tokenizer> tok;
  std::vector<prep::InputFile> files;
  int before = -1, after = -1;
  // The plan is computed by every rank from the inputs: they must name the same files
  // everywhere (a glob on a node with another view of the file system might not).
  std::string listed;
  for (const auto& f : c.inputs) listed += f + '\n';
  std::string root_list = listed;
  broadcast_string(comm, root_list);
  agree(comm, "", [&] {
    if (listed != root_list)
      throw ConfigError(cat("prep.input: this rank finds other input files (", c.inputs.size(),
                            ") than rank 0; the inputs must be on a file system every rank sees "
                            "alike"));
    tok = c.tokenizer == "hf"
              ? std::make_unique<io::HfTokenizer>(c.tokenizer_json, c.bos_token, c.eos_token)
              : io::make_tokenizer(c.tokenizer, c.vocab_json, c.merges_txt);
    // Separators around each document. GPT-2 (llm.c's convention): <|endoftext|> before each,
    // so the model learns where documents begin; hf: the tokenizer's BOS before (prep.bos) and
    // EOS after (prep.eos); the byte tokenizer has no such tokens and just concatenates.
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
      throw ConfigError(cat("prep.tokenizer=", c.tokenizer, ": the vocabulary has ",
                            tok->vocab_size(), " ids but token shards store uint16 (at most 65536 ids)",
                            c.vocab_json.empty() ? "" : cat(" (", c.vocab_json, ")"),
                            c.tokenizer_json.empty() ? "" : cat(" (", c.tokenizer_json, ")")));
    files = prep::stat_inputs(c.inputs);
    for (const auto& f : files) s.input_bytes += f.bytes;
    if (s.input_bytes == 0) throw ConfigError("prep.input: the input files are empty");
  });
  s.tokenizer = tok->name();
  s.vocab_size = tok->vocab_size();
  const std::vector<Unit> units =
      prep::plan_units(files, !c.document_start.empty(), size, c.chunk_bytes);
  s.units = static_cast<int>(units.size());
  std::vector<std::size_t> mine;
  for (std::size_t u = 0; u < units.size(); ++u)
    if (units[u].rank == rank) mine.push_back(u);
  std::vector<UnitOutput> outputs(mine.size());

  // Each rank tokenises its units, in file order; a failure on any rank is every rank's.
  double cpu[2] = {0, 0};  // this rank's CPU seconds for its units (max and sum over ranks below)
  {
    prep::Progress progress(comm, s.input_bytes, c.progress_every);
    const prep::Encoder enc(*tok, before, after);
    agree(comm, "", [&] {
      std::exception_ptr error;
      const double cpu0 = cpu_seconds();
      try {
        for (std::size_t i = 0; i < mine.size(); ++i) {
          prep::tokenize_unit(c, files[units[mine[i]].file], units[mine[i]], enc, outputs[i],
                              progress);
          if (!outputs[i].complete) break;  // prep.strict: this rank's first bad line
        }
      } catch (...) {
        error = std::current_exception();
      }
      cpu[0] = cpu[1] = cpu_seconds() - cpu0;
      progress.finish();
      if (error) std::rethrow_exception(error);
    });
  }
  s.tokenize_seconds = clock.seconds();
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &cpu[0], 1, MPI_DOUBLE, MPI_MAX, comm));
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &cpu[1], 1, MPI_DOUBLE, MPI_SUM, comm));
  s.tokenize_cpu_max = cpu[0];
  s.tokenize_cpu_sum = cpu[1];
  const std::vector<UnitSummary> summary = all_gather(comm, units, outputs);
  for (const auto& u : summary) {
    s.documents += u.documents;
    s.text_bytes += u.text_bytes;
    s.json_lines += u.lines;
    s.skipped_lines += u.skipped;
    for (int k = 0; k < 8; ++k) s.skipped_by_status[k] += u.skipped_by_status[k];
  }
  if (c.strict && s.skipped_lines > 0) {
    // The first skipped line in file order: every unit before it is complete (each rank stops
    // at its own first one and works in file order), so its line number is exact.
    std::size_t u = 0;
    while (summary[u].skipped == 0) ++u;
    throw Agreed<ConfigError>(cat(
        "prep.strict: ", prep::line_location(files, units, summary, u, summary[u].first_skipped_line),
        ": ", summary[u].first_skipped_detail, "; fix or remove the line, or run without "
        "prep.strict to skip such lines (they are counted and listed)"));
  }
  prep::write_outputs(c, comm, files, units, summary, mine, outputs, s);
  s.seconds = clock.seconds();
  return s;
}

int cmd_prep(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = prep_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  const PrepConfig c = prep_config(p.vm);  // every rank: same options, same verdict

  const PrepSummary s = run_prep(c, rt.world());
  auto list = [](const std::vector<std::string>& f) {
    std::string out;
    for (const auto& x : f) out += cat(out.empty() ? "" : ", ", x);
    return out;
  };
  logging::info("prep: ", c.inputs.size(), " input file(s), ", s.input_bytes, " bytes (",
                s.text_bytes, " uncompressed), ", s.documents, " document(s); tokenizer ",
                s.tokenizer, " (vocab ", s.vocab_size, ")");
  logging::info("prep: train ", s.train_tokens, " tokens in ", s.train_files.size(),
                " shard(s): ", list(s.train_files));
  if (!s.val_files.empty())
    logging::info("prep: val ", s.val_tokens, " tokens in ", s.val_files.size(),
                  " shard(s): ", list(s.val_files));
  if (!s.doc_index_files.empty())
    logging::info("prep: document index beside each shard (", s.doc_index_files.size(),
                  " .docs file(s))");
  if (s.skipped_lines > 0) {
    std::string kinds;
    for (int k = 1; k < 8; ++k)
      if (s.skipped_by_status[k] > 0)
        kinds += cat(kinds.empty() ? "" : ", ", s.skipped_by_status[k], " ",
                     io::describe(static_cast<io::JsonLineStatus>(k)));
    std::string first;
    for (const auto& l : s.first_skipped) first += cat("\n  ", l);
    logging::warn("prep: skipped ", s.skipped_lines, " of ", s.json_lines, " JSON lines (", kinds,
                  "; prep.text_field=", c.text_field, "), all listed in ", s.skipped_report,
                  "; the first:", first);
  }
  const double t = std::max(s.tokenize_seconds, 1e-9);
  logging::info("prep: ", s.units, " unit(s) on ", s.ranks, " rank(s): tokenised in ",
                s.tokenize_seconds, " s (", static_cast<double>(s.input_bytes) / t / 1e6,
                " MB/s of input, ", static_cast<double>(s.text_bytes) / t / 1e6,
                " MB/s uncompressed, ", static_cast<double>(s.train_tokens + s.val_tokens) / t / 1e6,
                "M tokens/s); ", s.seconds, " s in all; CPU ", s.tokenize_cpu_max,
                " s on the busiest rank, ", s.tokenize_cpu_sum, " s over all ranks");
  return kExitOk;
}

}  // namespace meshtrain::app
