#pragma once
// Private to src/app/prep*.cpp: the pieces of `meshtrain prep` over MPI ranks.
//   prep_plan.cpp      the inputs, cut into units of work and dealt out to ranks
//   prep_tokenize.cpp  one unit: read (mmap or decompress), split into documents, tokenise
//   prep_progress.cpp  the progress line on rank 0, fed by small messages from the others
//   prep_write.cpp     every rank writes its tokens in place in the shards; index; commit
// The output is the concatenation of the units' tokens in unit order, so it does not depend on
// how many ranks there are or which rank tokenised what.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/app/prep.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/io/json_lines.hpp"
#include "meshtrain/io/text_input.hpp"
#include "meshtrain/io/tokenizer.hpp"

namespace meshtrain::app::prep {

struct InputFile {
  std::string path;
  std::uint64_t bytes = 0;
  io::Compression compression = io::Compression::none;
  bool json_lines = false;
};

// Checks that every input can be read; ConfigError naming the file otherwise.
std::vector<InputFile> stat_inputs(const std::vector<std::string>& paths);

// A piece of work: the documents of `file` that begin in bytes [begin, end) (a compressed file,
// and a text file whose documents are whole files, is always one unit).
struct Unit {
  std::uint32_t file = 0;
  std::uint64_t begin = 0, end = 0;
  double cost = 0;  // estimated text bytes (compressed input counts 4x)
  int rank = 0;
};
// Units in file order, each given to a rank: longest first to the least loaded rank.
std::vector<Unit> plan_units(const std::vector<InputFile>& files, bool split_text, int ranks,
                             std::uint64_t chunk_bytes);

struct SkippedLine {
  std::uint64_t line = 0;  // 0-based within the unit
  io::JsonLineStatus status = io::JsonLineStatus::ok;
  std::string detail;
};

struct UnitOutput {
  std::vector<std::uint16_t> tokens;
  std::vector<std::uint64_t> doc_starts;  // offsets into tokens of documents with tokens
  std::uint64_t documents = 0, lines = 0, text_bytes = 0;
  std::vector<SkippedLine> skipped;
  bool complete = false;  // read to its end (prep.strict stops at the first skipped line)
};

// Rank 0 prints "prep: 41% of 2.1 GB | 35.2 MB/s | 120345 documents | 51.2M tokens | ETA 1m02s"
// every `every` seconds; the other ranks send it their counts (at most one message in flight).
class Progress {
 public:
  Progress(MPI_Comm comm, std::uint64_t total_bytes, double every);  // collective
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void add(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens) {
    mine_[0] += bytes;
    mine_[1] += documents;
    mine_[2] += tokens;
    if (every_ > 0 && clock_.seconds() >= next_) report();
  }
  // Every rank calls it once, after its last add (also after an error): rank 0 returns when it
  // has every rank's last counts.
  void finish();

 private:
  void report();
  void receive();
  void print();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::uint64_t total_;
  double every_, next_;
  Timer clock_;
  std::uint64_t mine_[3] = {};
  std::uint64_t send_[4] = {};
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<std::uint64_t> counts_;  // rank 0: [rank][3]
  int finished_ = 0;
};

// A document's tokens with the separators of the tokenizer kind (llm.c's GPT-2 convention: the
// end-of-text token before each; hf: BOS before and EOS after as configured; byte: none).
class Encoder {
 public:
  Encoder(const io::Tokenizer& tok, int before, int after)
      : tok_(tok), before_(before), after_(after) {}
  void document(std::string_view text, UnitOutput& out) const;

 private:
  const io::Tokenizer& tok_;
  int before_, after_;
};

void tokenize_unit(const PrepConfig& c, const InputFile& file, const Unit& unit,
                   const Encoder& enc, UnitOutput& out, Progress& progress);

// What every rank learns about every unit (all-gathered as bytes).
struct UnitSummary {
  std::uint64_t tokens = 0, documents = 0, with_tokens = 0, lines = 0, text_bytes = 0;
  std::uint64_t skipped = 0, first_skipped_line = 0;
  std::uint64_t skipped_by_status[8] = {};
  std::int32_t first_skipped_status = 0, complete = 0;
  char first_skipped_detail[128] = {};
};

// Writes the shards (and document indexes), commits them over the earlier ones and reports the
// skipped lines. Collective; `mine` are this rank's units, `outputs` their tokens.
void write_outputs(const PrepConfig& c, MPI_Comm comm, const std::vector<InputFile>& files,
                   const std::vector<Unit>& units, const std::vector<UnitSummary>& summary,
                   const std::vector<std::size_t>& mine, std::vector<UnitOutput>& outputs,
                   PrepSummary& s);

// "file:line" of a unit's 0-based line, counting the lines of the file's earlier units.
std::string line_location(const std::vector<InputFile>& files, const std::vector<Unit>& units,
                          const std::vector<UnitSummary>& summary, std::size_t unit,
                          std::uint64_t line);

}  // namespace meshtrain::app::prep
