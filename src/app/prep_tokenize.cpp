// `meshtrain prep`: one unit of work, read, split into documents and tokenised.
#include <algorithm>
#include <cstring>

#include "meshtrain/core/error.hpp"
#include "prep_internal.hpp"

namespace meshtrain::app::prep {

namespace {

// A short, printable excerpt of a line for the skipped-lines report.
std::string excerpt(std::string_view line) {
  constexpr std::size_t kMax = 48;
  std::string out;
  for (std::size_t i = 0; i < line.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    out += c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
  }
  if (line.size() > kMax) out += "...";
  return out;
}

std::string skipped_detail(const io::JsonLineResult& r, std::string_view line,
                           const std::string& field) {
  switch (r.status) {
    case io::JsonLineStatus::not_json:
      return cat("not JSON (", r.why, " at byte ", r.offset, "): ", excerpt(line));
    case io::JsonLineStatus::missing:
      return cat("no field \"", field, "\": ", excerpt(line));
    case io::JsonLineStatus::not_string:
      return cat("field \"", field, "\" is not a string: ", excerpt(line));
    case io::JsonLineStatus::duplicate:
      return cat("field \"", field, "\" given twice: ", excerpt(line));
    default:
      return cat(io::describe(r.status), ": ", excerpt(line));
  }
}

// Feeds the JSON lines of a unit to the encoder; false when prep.strict stops at a bad one.
class JsonLines {
 public:
  JsonLines(const PrepConfig& c, const Encoder& enc, UnitOutput& out)
      : c_(c), enc_(enc), out_(out) {}
  bool line(std::string_view line) {
    const std::uint64_t index = out_.lines++;
    out_.text_bytes += line.size() + 1;
    const io::JsonLineResult r = io::json_string_field(line, c_.text_field, text_);
    if (r.status == io::JsonLineStatus::ok) {
      enc_.document(text_, out_);
      return true;
    }
    out_.skipped.push_back({index, r.status, skipped_detail(r, line, c_.text_field)});
    return !c_.strict;
  }

 private:
  const PrepConfig& c_;
  const Encoder& enc_;
  UnitOutput& out_;
  std::string text_;
};

}  // namespace

void Encoder::document(std::string_view text, UnitOutput& out) const {
  ++out.documents;
  const std::size_t start = out.tokens.size();
  if (before_ >= 0) out.tokens.push_back(static_cast<std::uint16_t>(before_));
  const std::vector<std::int32_t> ids = tok_.encode(text);
  out.tokens.resize(out.tokens.size() + ids.size());
  std::transform(ids.begin(), ids.end(), out.tokens.end() - static_cast<std::ptrdiff_t>(ids.size()),
                 [](std::int32_t t) { return static_cast<std::uint16_t>(t); });
  if (after_ >= 0) out.tokens.push_back(static_cast<std::uint16_t>(after_));
  if (out.tokens.size() > start) out.doc_starts.push_back(start);
}

void tokenize_unit(const PrepConfig& c, const InputFile& file, const Unit& unit,
                   const Encoder& enc, UnitOutput& out, Progress& progress) {
  auto counted = [&](auto&& body) {  // reports what body added to `out` as progress
    const std::uint64_t d0 = out.documents, t0 = out.tokens.size();
    body();
    progress.add(0, out.documents - d0, out.tokens.size() - t0);
  };
  if (file.json_lines && file.compression == io::Compression::none) {
    // Lines that begin in [begin, end); the last may run past `end`.
    const io::MappedFile m(file.path, "prep.input");
    const std::string_view text = m.text();
    const std::uint64_t end = std::min<std::uint64_t>(unit.end, text.size());
    std::uint64_t pos = 0;
    if (unit.begin > 0) {
      const std::size_t nl = text.find('\n', unit.begin - 1);
      pos = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    progress.add(std::min(pos, end) - unit.begin, 0, 0);
    JsonLines lines(c, enc, out);
    while (pos < end) {
      const void* hit = std::memchr(text.data() + pos, '\n', text.size() - pos);
      const std::uint64_t eol =
          hit ? static_cast<std::uint64_t>(static_cast<const char*>(hit) - text.data()) : text.size();
      bool go = true;
      counted([&] { go = lines.line(text.substr(pos, eol - pos)); });
      progress.add(std::min(eol + 1, end) - pos, 0, 0);
      if (!go) return;
      pos = eol + 1;
    }
  } else if (file.json_lines) {
    io::DecompressingReader r(file.path, file.compression, "prep.input");
    io::LineReader reader(r);
    JsonLines lines(c, enc, out);
    std::string_view line;
    std::uint64_t seen = 0;
    for (;;) {
      bool more = false, go = true;
      counted([&] {
        more = reader.next(line);
        if (more) go = lines.line(line);
      });
      progress.add(r.consumed() - seen, 0, 0);
      seen = r.consumed();
      if (!more) break;
      if (!go) return;
    }
  } else {
    std::string owned;
    std::unique_ptr<io::MappedFile> mapped;
    std::string_view text;
    if (file.compression == io::Compression::none) {
      mapped = std::make_unique<io::MappedFile>(file.path, "prep.input");
      text = mapped->text();
    } else {
      io::DecompressingReader r(file.path, file.compression, "prep.input");
      owned = io::read_all(r);
      text = owned;
    }
    counted([&] {
      if (c.document_start.empty()) {  // the whole file is one document, even an empty one
        out.text_bytes += text.size();
        enc.document(text, out);
        return;
      }
      const bool whole = file.compression != io::Compression::none;
      for (std::string_view doc : io::split_documents_in_range(
               text, whole ? 0 : unit.begin, whole ? text.size() : unit.end, c.document_start,
               "prep.document_start")) {
        out.text_bytes += doc.size();
        enc.document(doc, out);
      }
    });
    progress.add(unit.end - unit.begin, 0, 0);
  }
  out.complete = true;
}

}  // namespace meshtrain::app::prep
