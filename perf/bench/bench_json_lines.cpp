// Getting the "text" string out of JSON lines, three ways, on the same bytes (issue 38):
//   dom      nlohmann::json::parse of each line, then ["text"] (what core/json would do)
//   sax      nlohmann::json::sax_parse with a handler that keeps only the top-level "text"
//   scanner  io::json_string_field (what `meshtrain prep` uses)
// next to splitting the lines alone (memchr). Each way must find the same texts; the best of
// --rounds is reported as MB/s of JSON lines on one core.
//   bench_json_lines [--file corpus.jsonl] [--mb 64] [--rounds 5]
// Without --file, a Dolma-like corpus is made from inputs/kjv.txt (or --text FILE): documents
// of about 3 kB of text with an id, a source, a date and a metadata object.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/io/json_lines.hpp"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string make_corpus(const std::string& text, std::size_t bytes) {
  std::string out;
  std::size_t at = 0, id = 0;
  while (out.size() < bytes) {
    std::size_t n = 2000 + (id * 7919) % 2000;
    if (at + n > text.size()) at = 0;
    nlohmann::json j;
    j["id"] = "doc-" + std::to_string(id);
    j["text"] = text.substr(at, n) + " \u00e9\u20ac\U0001F600 \"quoted\"\t";
    j["source"] = "kjv";
    j["added"] = "2024-05-20T00:00:00.000Z";
    j["metadata"] = {{"url", "https://example.org/" + std::to_string(id)},
                     {"lang", "en"},
                     {"score", 0.5 + (id % 50) / 100.0},
                     {"tags", {"bible", "prose"}}};
    out += j.dump() + "\n";
    at += n;
    ++id;
  }
  return out;
}

// Keeps the value of the top-level "text" member; everything else is parsed and dropped.
struct TextSax : nlohmann::json_sax<nlohmann::json> {
  std::string* out;
  int depth = 0;
  bool want = false;
  bool found = false;
  explicit TextSax(std::string* o) : out(o) {}
  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t) override { return scalar(); }
  bool number_unsigned(number_unsigned_t) override { return scalar(); }
  bool number_float(number_float_t, const string_t&) override { return scalar(); }
  bool string(string_t& s) override {
    if (want) {
      out->swap(s);
      found = true;
    }
    return scalar();
  }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override {
    want = false;
    ++depth;
    return true;
  }
  bool key(string_t& k) override {
    want = depth == 1 && k == "text";
    return true;
  }
  bool end_object() override {
    --depth;
    return true;
  }
  bool start_array(std::size_t) override {
    want = false;
    ++depth;
    return true;
  }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
  bool scalar() {
    want = false;
    return true;
  }
};

template <class F>
void for_lines(const std::string& corpus, F&& f) {
  const char* p = corpus.data();
  const char* e = p + corpus.size();
  while (p < e) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(e - p)));
    if (!nl) nl = e;
    f(std::string_view(p, static_cast<std::size_t>(nl - p)));
    p = nl + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, text = "inputs/kjv.txt";
  double mb = 64;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--file") file = argv[i + 1];
    else if (a == "--text") text = argv[i + 1];
    else if (a == "--mb") mb = std::atof(argv[i + 1]);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_json_lines [--file F | --text F --mb N] [--rounds R]\n");
      return 2;
    }
  }
  const std::string corpus =
      file.empty() ? make_corpus(slurp(text), static_cast<std::size_t>(mb * 1e6)) : slurp(file);
  std::size_t lines = 0;
  for_lines(corpus, [&](std::string_view) { ++lines; });
  std::printf("%zu JSON lines, %.1f MB%s\n", lines, corpus.size() / 1e6,
              file.empty() ? " (made from the text file)" : "");

  std::uint64_t want = 0;  // sum of the text lengths, which every way must reproduce
  const std::vector<std::pair<const char*, std::function<std::uint64_t()>>> ways = {
      {"lines only", [&] {
         std::uint64_t n = 0;
         for_lines(corpus, [&](std::string_view l) { n += l.size() > 0; });
         return n;
       }},
      {"nlohmann dom", [&] {
         std::uint64_t n = 0;
         for_lines(corpus, [&](std::string_view l) {
           const auto j = nlohmann::json::parse(l);
           n += j.at("text").get_ref<const std::string&>().size();
         });
         return n;
       }},
      {"nlohmann sax", [&] {
         std::uint64_t n = 0;
         std::string s;
         for_lines(corpus, [&](std::string_view l) {
           TextSax h(&s);
           nlohmann::json::sax_parse(l, &h);
           n += h.found ? s.size() : 0;
         });
         return n;
       }},
      {"scanner", [&] {
         std::uint64_t n = 0;
         std::string s;
         for_lines(corpus, [&](std::string_view l) {
           if (meshtrain::io::json_string_field(l, "text", s).status ==
               meshtrain::io::JsonLineStatus::ok)
             n += s.size();
         });
         return n;
       }},
  };
  std::printf("%-14s %10s %10s\n", "way", "MB/s", "ms");
  for (const auto& [name, run] : ways) {
    double best = 1e30;
    std::uint64_t got = 0;
    for (int r = 0; r < rounds; ++r) {
      const double t0 = now();
      got = run();
      best = std::min(best, now() - t0);
    }
    if (std::string(name) != "lines only") {
      if (want == 0) want = got;
      if (got != want) {
        std::fprintf(stderr, "%s found %llu bytes of text, expected %llu\n", name,
                     static_cast<unsigned long long>(got), static_cast<unsigned long long>(want));
        return 1;
      }
    }
    std::printf("%-14s %10.1f %10.1f\n", name, corpus.size() / best / 1e6, best * 1e3);
  }
  return 0;
}
