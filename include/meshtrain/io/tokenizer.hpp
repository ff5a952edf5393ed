#pragma once
// Tokenizers for `meshtrain prep` and `meshtrain generate`:
//  - ByteTokenizer: vocab 256, token = byte value (no files needed).
//  - Gpt2BpeTokenizer: byte-level BPE read from HuggingFace's vocab.json + merges.txt (GPT-2's
//    pre-tokenisation and byte-to-unicode map), when the user supplies those files.
//  - HfTokenizer: byte-level BPE read from a HuggingFace tokenizer.json (as Llama 3, Qwen 2 and
//    GPT-2 ship it): its vocabulary and merges, added/special tokens, its pre-tokenizer (Split
//    regexes with their behaviours, ByteLevel) and the ByteLevel decoder.
// Pre-tokenizer regexes run through PCRE2 with Unicode properties (src/io/pcre2_regex.hpp).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int vocab_size() const = 0;
  // End-of-text token put between documents (-1 if none).
  virtual int eot() const = 0;
  // Beginning-of-text token (-1 if none).
  virtual int bos() const { return -1; }
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<std::int32_t>& tokens) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int vocab_size() const override { return 256; }
  int eot() const override { return -1; }
  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& tokens) const override;
};

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  // Throws ConfigError naming the file (and line for merges.txt) when a file is missing or bad.
  Gpt2BpeTokenizer(const std::string& vocab_json, const std::string& merges_txt);
  ~Gpt2BpeTokenizer() override;
  std::string name() const override { return "gpt2-bpe"; }
  int vocab_size() const override;
  int eot() const override;  // "<|endoftext|>" if present in the vocab
  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& tokens) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json, or a folder holding one. BOS and EOS are the tokens named
  // `bos_token` / `eos_token` when given, else those of a tokenizer_config.json beside the file
  // ("bos_token", "eos_token"), else the token the post-processor's template puts first (BOS)
  // and the first of <|end_of_text|>, <|endoftext|>, </s>, <eos> among the added tokens (EOS).
  // ConfigError naming the file (and the part of it) for anything it cannot read or does not
  // support: another model than byte-level BPE, a normalizer, an unknown pre-tokenizer.
  explicit HfTokenizer(const std::string& path, const std::string& bos_token = "",
                       const std::string& eos_token = "");
  ~HfTokenizer() override;
  std::string name() const override { return "hf"; }
  int vocab_size() const override;  // the largest id (vocabulary or added token) + 1
  int eot() const override;         // EOS, -1 if none was found
  int bos() const override;
  const std::string& path() const;  // the tokenizer.json read
  // Id of the vocabulary entry or added token `content`, -1 if none.
  int token_id(const std::string& content) const;
  // The text's tokens without any template (HF's encode(text, add_special_tokens=False)):
  // added tokens in the text are matched first (leftmost, longest), the rest is pre-tokenized
  // and merged.
  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& tokens) const override;
  // The pre-tokenizer's pieces of text (raw bytes, before the byte-to-symbol map), with no
  // added-token matching. For tests and tools.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GPT-2's pre-tokenisation (the regex of openai/gpt-2 encoder.py, gpt2_pattern(), through
// PCRE2): the pieces that BPE then merges within. Exposed for tests and tools.
std::vector<std::string> gpt2_pretokenize(std::string_view text);
const std::string& gpt2_pattern();

// The documents of a text: each line (without its newline) that `line_regex` (PCRE2, UTF +
// UCP) matches begins one, and the text before the first such line is one too; empty pieces
// are dropped. An empty regex: the whole text, even an empty one, is one document. ConfigError
// naming `what` for a regex that does not compile.
std::vector<std::string_view> split_documents(std::string_view text, const std::string& line_regex,
                                              const std::string& what);
// The documents of split_documents(text, line_regex) that begin in the byte range [begin, end)
// of the text, whole (the last may run past `end`): ranges that tile the text give every
// document once, so `meshtrain prep` ranks can share a file. `line_regex` must not be empty.
std::vector<std::string_view> split_documents_in_range(std::string_view text, std::size_t begin,
                                                       std::size_t end,
                                                       const std::string& line_regex,
                                                       const std::string& what);

// "byte"; "gpt2" with vocab.json and merges.txt; "hf" with a tokenizer.json (or a folder with
// one) as the first file. A "gpt2" call whose first file is named tokenizer.json and that has
// no merges file reads it as "hf". ConfigError otherwise.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt);

}  // namespace meshtrain::io
