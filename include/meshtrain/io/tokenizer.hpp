#pragma once
// Tokenizers for `meshtrain prep` and `meshtrain generate`:
//  - ByteTokenizer: vocab 256, token = byte value (no files needed).
//  - Gpt2BpeTokenizer: byte-level BPE read from HuggingFace's vocab.json + merges.txt (GPT-2's
//    pre-tokenisation and byte-to-unicode map), when the user supplies those files.
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
  // End-of-text token appended between documents (-1 if none).
  virtual int eot() const = 0;
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

// GPT-2's pre-tokenisation (the regex of openai/gpt-2 encoder.py, by hand): the pieces that BPE
// then merges within. Exposed for tests and tools.
std::vector<std::string> gpt2_pretokenize(std::string_view text);

// "byte", or "gpt2" with the two files; ConfigError otherwise.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt);

}  // namespace meshtrain::io
