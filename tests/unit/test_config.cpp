#include <cstdio>
#include <fstream>
#include <string>

#include "harness.hpp"
#include "meshtrain/app/options.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/core/error.hpp"

using namespace meshtrain;
namespace po = boost::program_options;

namespace {
po::options_description desc() {
  po::options_description d;
  d.add(config::generic_options()).add(app::mesh_options()).add(app::log_options());
  po::options_description t("train");
  t.add_options()("train.lr", po::value<double>()->default_value(1e-3), "lr")
      ("train.name", po::value<std::string>()->default_value("x"), "name");
  d.add(t);
  return d;
}
std::string write_ini(const std::string& name, const std::string& text) {
  std::string path = "test_config_" + name + "_" + std::to_string(mt_test::world_rank()) + ".ini";
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST_CASE("defaults, INI file and command line, in that order of precedence", "[config]") {
  const auto ini = write_ini("prec", "[mesh]\ntp = 2\npp = 2\n[train]\nlr = 0.5\n");
  auto p = config::parse({"--config", ini, "--mesh.tp", "4"}, desc());
  REQUIRE(p.vm["mesh.tp"].as<int>() == 4);     // command line wins
  REQUIRE(p.vm["mesh.pp"].as<int>() == 2);     // file beats default
  REQUIRE(p.vm["train.lr"].as<double>() == 0.5);
  REQUIRE(p.vm["mesh.order"].as<std::string>() == "tp-dp-pp");  // default
  REQUIRE(p.vm["log.all_ranks"].as<bool>() == false);
  REQUIRE(config::origin(p, "mesh.order") == "default");
  auto p2 = config::parse({"--log.all_ranks"}, desc());
  REQUIRE(p2.vm["log.all_ranks"].as<bool>() == true);
  std::remove(ini.c_str());
}

TEST_CASE("unknown keys and bad values name the key and the file", "[config]") {
  const auto ini = write_ini("unknown", "[train]\nlrr = 0.5\n");
  try {
    config::parse({"--config", ini}, desc());
    FAIL("unknown key accepted");
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    REQUIRE(w.find("train.lrr") != std::string::npos);
    REQUIRE(w.find(ini) != std::string::npos);
  }
  const auto bad = write_ini("badvalue", "[mesh]\ntp = two\n");
  try {
    config::parse({"--config", bad}, desc());
    FAIL("bad value accepted");
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    REQUIRE(w.find("mesh.tp") != std::string::npos);
    REQUIRE(w.find(bad) != std::string::npos);
  }
  try {
    config::parse({"--mesh.tpp", "2"}, desc());
    FAIL("unknown option accepted");
  } catch (const ConfigError& e) {
    REQUIRE(std::string(e.what()).find("mesh.tpp") != std::string::npos);
  }
  try {
    config::parse({"--config", "does/not/exist.ini"}, desc());
    FAIL("missing file accepted");
  } catch (const ConfigError& e) {
    REQUIRE(std::string(e.what()).find("does/not/exist.ini") != std::string::npos);
  }
  std::remove(ini.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("resolved configuration round-trips through an INI file", "[config]") {
  auto d = desc();
  auto p = config::parse({"--mesh.tp", "2", "--train.lr", "0.25", "--train.name", "demo run"}, d);
  const std::string text = config::resolved_ini(p.vm, d);
  REQUIRE(text.find("[mesh]\n") != std::string::npos);
  REQUIRE(text.find("tp = 2\n") != std::string::npos);
  const auto ini = write_ini("roundtrip", text);
  auto q = config::parse({"--config", ini}, d);
  REQUIRE(config::resolved_ini(q.vm, d) == text);
  std::remove(ini.c_str());
}

TEST_CASE("mesh sizes: dp derived from the world, bad sizes rejected", "[config]") {
  auto d = desc();
  auto p = config::parse({"--mesh.tp", "2", "--mesh.pp", "2"}, d);
  REQUIRE(app::mesh_shape(p.vm, 8).dp == 2);
  REQUIRE_THROWS_AS(app::mesh_shape(p.vm, 6), ConfigError);
  auto z = config::parse({"--mesh.tp", "0"}, d);
  REQUIRE_THROWS_AS(app::mesh_shape(z.vm, 4), ConfigError);
  auto n = config::parse({"--mesh.dp", "-2"}, d);
  REQUIRE_THROWS_AS(app::mesh_shape(n.vm, 4), ConfigError);
}

TEST_CASE("no option is guessed from a prefix; the closest one is named", "[config]") {
  // Boost's default style would take --train.nam for train.name.
  try {
    config::parse({"--train.nam", "y"}, desc());
    FAIL("a prefix was taken for the option");
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    REQUIRE(w.find("unknown option '--train.nam'") != std::string::npos);
    REQUIRE(w.find("did you mean --train.name?") != std::string::npos);
  }
  const auto ini = write_ini("prefix", "[train]\nnam = y\n");
  try {
    config::parse({"--config", ini}, desc());
    FAIL("a prefix was taken for the key");
  } catch (const ConfigError& e) {
    REQUIRE(std::string(e.what()).find("did you mean train.name?") != std::string::npos);
  }
  std::remove(ini.c_str());
  REQUIRE(config::parse({"--train.name", "z"}, desc()).vm["train.name"].as<std::string>() == "z");
}
