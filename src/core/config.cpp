#include "meshtrain/core/config.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "meshtrain/core/error.hpp"

namespace meshtrain::config {

po::options_description generic_options() {
  po::options_description g("Generic options");
  g.add_options()
      ("help,h", "print this help and exit")
      ("config,c", po::value<std::string>(),
       "INI file with [section] key = value lines; the command line overrides it");
  return g;
}

namespace {

// Boost reports "the argument ('x') for option '--mesh.tp' is invalid"; we add where it came from.
[[noreturn]] void rethrow(const po::error& e, const std::string& where) {
  throw ConfigError(cat(e.what(), " (", where, ")"));
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "; did you mean train.steps?" for a misspelt or shortened key, empty when nothing is close.
std::string suggestion(std::string key, const po::options_description& desc, const char* dashes) {
  while (!key.empty() && key[0] == '-') key.erase(0, 1);
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, key.size() / 4) + 1;
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    const std::size_t d = edit_distance(key, name);
    if (d < best_d) best = name, best_d = d;
  }
  return best.empty() ? std::string() : cat("; did you mean ", dashes, best, "?");
}

}  // namespace

Parsed parse(const std::vector<std::string>& args, const po::options_description& desc,
             const Layer& layer, const std::string& layer_name) {
  Parsed p;
  try {
    // No guessing: Boost would take --train.step for the only option it prefixes
    // (train.steps), which an INI file never does. A key is spelt out in full in both.
    const int style = po::command_line_style::default_style &
                      ~po::command_line_style::allow_guessing;
    auto parsed = po::command_line_parser(args).options(desc).style(style).run();
    po::store(parsed, p.vm);
  } catch (const po::unknown_option& e) {
    throw ConfigError(cat("unknown option '", e.get_option_name(), "' (command line",
                          suggestion(e.get_option_name(), desc, "--"), "; see --help)"));
  } catch (const po::error& e) {
    rethrow(e, "command line; see --help");
  }
  p.help = p.vm.count("help") > 0;
  po::parsed_options file_options(&desc);
  if (p.vm.count("config")) {
    p.config_file = p.vm["config"].as<std::string>();
    std::ifstream in(p.config_file);
    if (!in) {
      throw ConfigError(cat("config file '", p.config_file, "' (--config) cannot be opened: ",
                            std::filesystem::exists(p.config_file) ? "permission denied"
                                                                   : "no such file"));
    }
    try {
      file_options = po::parse_config_file(in, desc, /*allow_unregistered=*/false);
    } catch (const po::unknown_option& e) {
      const std::string hint = suggestion(e.get_option_name(), desc, "");
      throw ConfigError(cat("unknown key '", e.get_option_name(), "' in ", p.config_file, " (",
                            hint.empty() ? std::string() : hint.substr(2) + "; ",
                            "see --help for the keys of this subcommand)"));
    } catch (const po::error& e) {
      rethrow(e, p.config_file);
    }
  }
  // po::store keeps the first value it sees for a key: command line, then the layer, then the
  // file, then defaults.
  try {
    if (layer) {
      po::variables_map base = p.vm;
      po::store(file_options, base);
      po::notify(base);
      po::parsed_options extra(&desc);
      for (auto& [key, value] : layer(LayerInput{p.vm, base}))
        extra.options.emplace_back(key, std::vector<std::string>{value});
      try {
        po::store(extra, p.vm);
      } catch (const po::error& e) {
        rethrow(e, layer_name);
      }
    }
    po::store(file_options, p.vm);
  } catch (const po::error& e) {
    rethrow(e, p.config_file);
  }
  try {
    po::notify(p.vm);
  } catch (const po::error& e) {
    rethrow(e, p.config_file.empty() ? "command line" : "command line or " + p.config_file);
  }
  return p;
}

bool given(const po::variables_map& vm, const std::string& key) {
  auto it = vm.find(key);
  return it != vm.end() && !it->second.empty() && !it->second.defaulted();
}

namespace {

std::string format_value(const boost::any& v) {
  if (auto* x = boost::any_cast<std::string>(&v)) return *x;
  if (auto* x = boost::any_cast<int>(&v)) return std::to_string(*x);
  if (auto* x = boost::any_cast<long>(&v)) return std::to_string(*x);
  if (auto* x = boost::any_cast<long long>(&v)) return std::to_string(*x);
  if (auto* x = boost::any_cast<unsigned long>(&v)) return std::to_string(*x);
  if (auto* x = boost::any_cast<bool>(&v)) return *x ? "true" : "false";
  if (auto* x = boost::any_cast<double>(&v)) {
    // The shortest text that reads back as the same double: a printed configuration (checkpoint
    // attribute, `meshtrain config`) trains exactly the run it came from.
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, *x, std::chars_format::general);
    return std::string(buf, r.ptr);
  }
  if (auto* x = boost::any_cast<float>(&v)) {
    std::ostringstream os;
    os.precision(8);
    os << *x;
    return os.str();
  }
  return "<unprintable>";
}

}  // namespace

std::string resolved_ini(const po::variables_map& vm, const po::options_description& desc,
                         bool defaults) {
  std::map<std::string, std::map<std::string, std::string>> sections;
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    if (name == "help" || name == "config" || name == "deepspeed") continue;
    auto it = vm.find(name);
    if (it == vm.end() || it->second.empty() || (!defaults && it->second.defaulted())) continue;
    auto dot = name.find('.');
    std::string sec = dot == std::string::npos ? "" : name.substr(0, dot);
    std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
    sections[sec][key] = format_value(it->second.value());
  }
  std::ostringstream os;
  for (const auto& [sec, kv] : sections) {
    if (!sec.empty()) os << "[" << sec << "]\n";
    for (const auto& [k, v] : kv) os << k << " = " << v << "\n";
  }
  return os.str();
}

std::string origin(const Parsed& p, const std::string& key) {
  auto it = p.vm.find(key);
  if (it == p.vm.end()) return "unset";
  if (it->second.defaulted()) return "default";
  // A value present on the command line was stored first; we cannot tell which store set it
  // from the variables_map alone, so name both candidates when a file was given.
  return p.config_file.empty() ? "command line" : "command line or " + p.config_file;
}

}  // namespace meshtrain::config
