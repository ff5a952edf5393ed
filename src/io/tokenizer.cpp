// The byte tokenizer and the tokenizer factory. The GPT-2 BPE tokenizer is in bpe_tokenizer.cpp,
// the HuggingFace tokenizer.json one in hf_tokenizer.cpp.
#include "meshtrain/io/tokenizer.hpp"

#include "meshtrain/core/error.hpp"
#include "pcre2_regex.hpp"

namespace meshtrain::io {

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  std::string out(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 255)
      throw ConfigError(cat("byte tokenizer: token id ", tokens[i], " at position ", i,
                            " is not a byte (0..255); was the model trained with another tokenizer?"));
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

std::vector<std::string_view> split_documents(std::string_view text, const std::string& line_regex,
                                              const std::string& what) {
  if (line_regex.empty()) return {text};  // even an empty file is a document
  return split_documents_in_range(text, 0, text.size(), line_regex, what);
}

std::vector<std::string_view> split_documents_in_range(std::string_view text, std::size_t begin,
                                                       std::size_t end,
                                                       const std::string& line_regex,
                                                       const std::string& what) {
  MESHTRAIN_CHECK(!line_regex.empty() && begin <= end, "split_documents_in_range: [", begin, ", ",
                  end, ") with regex '", line_regex, "'");
  // Documents begin at 0 and at each later line that matches; the range owns those that begin
  // inside it and reads on past its end to where the last of them ends.
  const detail::Pcre2Regex re(line_regex, what);
  std::vector<std::string_view> docs;
  std::size_t line = 0;  // the first line starting at or after `begin`
  if (begin > 0) {
    const std::size_t nl = text.find('\n', begin - 1);
    line = nl == std::string_view::npos ? text.size() : nl + 1;
  }
  bool open = begin == 0;  // a document of ours is open, starting at doc_start
  std::size_t doc_start = 0;
  while (line < text.size()) {
    if (!open && line >= end) break;
    std::size_t eol = text.find('\n', line);
    if (eol == std::string_view::npos) eol = text.size();
    bool hit = false;
    if (line > 0)
      re.for_each_match(text.substr(line, eol - line), [&](std::size_t, std::size_t) { hit = true; });
    if (hit) {
      if (open) docs.push_back(text.substr(doc_start, line - doc_start));
      open = line < end;
      doc_start = line;
    }
    line = eol + 1;
  }
  if (open && doc_start < text.size()) docs.push_back(text.substr(doc_start));
  return docs;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  const std::string_view suffix = "tokenizer.json";
  const bool named_tokenizer_json =
      vocab_json.size() >= suffix.size() &&
      vocab_json.compare(vocab_json.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (kind == "hf" || (kind == "gpt2" && named_tokenizer_json && merges_txt.empty())) {
    if (vocab_json.empty())
      throw ConfigError("tokenizer 'hf' needs a HuggingFace tokenizer.json (or a folder with one)");
    return std::make_unique<HfTokenizer>(vocab_json);
  }
  if (kind == "gpt2") {
    if (vocab_json.empty() || merges_txt.empty())
      throw ConfigError("tokenizer 'gpt2' needs both a vocab.json and a merges.txt file");
    return std::make_unique<Gpt2BpeTokenizer>(vocab_json, merges_txt);
  }
  throw ConfigError(cat("tokenizer '", kind, "' is unknown; expected 'byte', 'gpt2' or 'hf'"));
}

}  // namespace meshtrain::io
