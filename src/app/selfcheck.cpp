// `meshtrain selfcheck`: builds the process mesh from the options, prints each rank's coordinates
// and groups, then runs every communicator operation on every sub-communicator and every backend
// of this build, checking results against values computed from rank numbers. The smallest job
// that proves a machine, an MPI and a layout work before a long training run is queued.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "meshtrain/app/options.hpp"
#include "meshtrain/app/selfcheck.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/selftest.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/mesh/process_mesh.hpp"

namespace meshtrain::app {

po::options_description selfcheck_options() {
  po::options_description d;
  d.add(config::generic_options()).add(mesh_options()).add(comm_options()).add(log_options());
  po::options_description s("Self-check [selfcheck]");
  s.add_options()("selfcheck.counts",
                  po::value<std::string>()->default_value("0,1,7,1000,65537"),
                  "element counts to test, comma-separated (odd sizes on purpose)");
  d.add(s);
  return d;
}

namespace {

std::vector<std::size_t> parse_counts(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    auto comma = s.find(',', pos);
    std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      std::size_t used = 0;
      long v = std::stol(tok, &used);
      if (used != tok.size() || v < 0) throw std::invalid_argument(tok);
      out.push_back(static_cast<std::size_t>(v));
    } catch (const std::exception&) {
      throw ConfigError(cat("selfcheck.counts='", s, "': '", tok, "' is not a non-negative integer"));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

int cmd_selfcheck(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = selfcheck_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  const mesh::Shape shape = mesh_shape(p.vm, rt.size());
  const mesh::Order order = mesh_order(p.vm);
  const auto counts = parse_counts(p.vm["selfcheck.counts"].as<std::string>());
  std::vector<comm::Backend> backends;
  const std::string b = p.vm["comm.backend"].as<std::string>();
  if (b == "auto") backends = comm::available_backends();
  else backends = {comm::parse_backend(b)};

  mesh::ProcessMesh m(rt.world(), shape, order);
  auto ctx = logging::context();
  ctx.coords = m.coord_string();
  logging::set_context(ctx);

  logging::info("meshtrain selfcheck: ", m.describe());
  logging::info("resolved configuration:\n", config::resolved_ini(p.vm, desc));
  logging::info(kc::configuration_summary(), rt.device() >= 0 ? cat(", GPU ", rt.device()) : "");
  const int e = m.embedding().is_null() ? -1 : m.embedding().size();
  logging::write(logging::Level::info,
             cat("coords dp/pp/tp = ", m.coord_string(), "; tp group ",
                 join(mesh::group_along(m.rank(), mesh::Axis::tp, shape, order)), "; dp group ",
                 join(mesh::group_along(m.rank(), mesh::Axis::dp, shape, order)), "; pp group ",
                 join(mesh::group_along(m.rank(), mesh::Axis::pp, shape, order)),
                 "; embedding group ", e < 0 ? "-" : join(mesh::embedding_group(m.rank(), shape, order)),
                 "; node-local rank ", m.local_rank(), "/", m.local_size()),
             ctx.all_ranks);

  struct Group {
    const char* name;
    const mesh::MpiComm* comm;
  };
  std::vector<Group> groups = {{"world", &m.world()}, {"tp", &m.tp()},
                                {"dp", &m.dp()},       {"pp", &m.pp()},
                                {"model_parallel", &m.model_parallel()},
                                {"embedding", &m.embedding()}};
  if (shape.cp > 1) {  // context parallelism: the cp ring and the replicas it adds to dp
    groups.push_back({"cp", &m.cp()});
    groups.push_back({"dp+cp", &m.replicas()});
  }

  int local_failures = 0;
  std::map<std::string, int> checks_per_group;
  Timer t;
  for (comm::Backend be : backends) {
    for (const Group& g : groups) {
      // Every rank walks the same list; ranks outside a group (middle pipeline stages for the
      // embedding group) skip it, and members only talk among themselves.
      if (g.comm->is_null()) continue;
      auto c = comm::make_communicator(be, g.comm->get());
      for (const auto& r : comm::self_test(*c, counts)) {
        checks_per_group[cat(comm::backend_name(be), " ", g.name)]++;
        if (!r.ok) {
          ++local_failures;
          logging::each("FAILED ", comm::backend_name(be), " ", g.name, " ", r.op, " count ", r.count,
                    ": ", r.detail);
        }
      }
    }
  }
  int failures = 0;
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(&local_failures, &failures, 1, MPI_INT, MPI_SUM,
                                    m.world().get()));
  for (const auto& [k, n] : checks_per_group)
    logging::info(cat("  ", k, ": ", n, " checks on rank 0"));
  logging::info(failures == 0 ? "selfcheck passed" : cat("selfcheck FAILED: ", failures, " mismatches"),
            " (", backends.size(), " backend(s), ", counts.size(), " sizes, ",
            cat(static_cast<int>(t.seconds() * 1000)), " ms)");
  return failures == 0 ? kExitOk : kExitFailure;
}

}  // namespace meshtrain::app
