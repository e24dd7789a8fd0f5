#include "plan/nccl.h"

#include "engine/data_files.h"
#include "engine/errors.h"
#include "engine/memory.h"

#include <fmt/format.h>

#include <fstream>

namespace zc::plan {
namespace {

constexpr sim::NcclFunc kFuncs[] = {sim::NcclFunc::broadcast, sim::NcclFunc::reduce, sim::NcclFunc::all_gather,
                                    sim::NcclFunc::reduce_scatter, sim::NcclFunc::all_reduce};
constexpr const char* kFuncNames[] = {"broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce"};

const char* func_name(sim::NcclFunc f) { return kFuncNames[static_cast<int>(f)]; }

// The node type of `gpu` and the communicator of `ranks` ranks on it.
const NcclNodeSpec& node_of(const Hardware& hw, const GpuSpec& g) {
  if (g.nccl_node.empty()) {
    std::string with;
    for (const GpuSpec& o : hw.gpus) {
      if (!o.nccl_node.empty()) with += (with.empty() ? "" : ", ") + o.key;
    }
    throw ConfigError(fmt::format("{} has no NCCL graphs in {} (node_defaults.{}.nccl); GPUs with them: {}",
                                  g.key, hw.path, g.key, with));
  }
  return hw.nccl_node(g.nccl_node);
}

sim::NcclComm comm_of(const NcclNodeSpec& n, int ranks, int gpus_per_node) {
  if (ranks < 2) throw UsageError(fmt::format("NCCL's model needs 2 or more ranks, not {}", ranks));
  const int per_node = std::min(ranks, gpus_per_node);
  if (ranks % per_node != 0) {
    throw UsageError(fmt::format("{} ranks do not fill nodes of {} GPUs", ranks, gpus_per_node));
  }
  return n.node.comm(ranks, ranks / per_node);
}

// The best protocol of one algorithm (a row that forces NCCL_ALGO), or NCCL's own choice.
sim::NcclChoice choose(const sim::NcclComm& c, const sim::NcclTuning& t, sim::NcclFunc f, std::int64_t bytes,
                       const std::string& algorithm) {
  if (algorithm.empty()) return sim::nccl_choose(c, t, f, bytes);
  std::optional<sim::NcclChoice> best;
  for (int a = 0; a < sim::kNcclAlgos; ++a) {
    const auto algo = static_cast<sim::NcclAlgo>(a);
    if (sim::nccl_algo_name(algo) != algorithm) continue;
    for (int p = 0; p < sim::kNcclProtos; ++p) {
      const auto proto = static_cast<sim::NcclProto>(p);
      const float time = sim::nccl_algo_time(c, t, f, algo, proto, bytes);
      if (time >= 0 && (!best || time < best->time_us)) best = sim::NcclChoice{algo, proto, time};
    }
  }
  if (!best) throw ConfigError(fmt::format("NCCL algorithm '{}' is not available for {}", algorithm, func_name(f)));
  return *best;
}

double busbw(sim::NcclFunc f, int ranks, std::int64_t bytes, double time_us) {
  return static_cast<double>(bytes) / (time_us * 1e3) * nccl_bus_factor(f, ranks);
}

std::string graph_text(const char* name, const sim::NcclGraph& g) {
  if (g.channels == 0) return fmt::format("{} none", name);
  return fmt::format("{} {} x {:g}/{:g} GB/s", name, g.channels, g.bw_intra, g.bw_inter);
}

}  // namespace

std::optional<sim::NcclFunc> nccl_function(const std::string& name) {
  for (sim::NcclFunc f : kFuncs) {
    if (name == func_name(f)) return f;
  }
  return std::nullopt;
}

double nccl_bus_factor(sim::NcclFunc f, int ranks) {
  const double n = ranks;
  switch (f) {
    case sim::NcclFunc::all_reduce: return 2.0 * (n - 1) / n;
    case sim::NcclFunc::all_gather:
    case sim::NcclFunc::reduce_scatter: return (n - 1) / n;
    default: return 1.0;
  }
}

NcclSweep nccl_sweep(const Hardware& hw, const std::string& gpu, int ranks, int gpus_per_node, sim::NcclFunc f,
                     const std::vector<std::int64_t>& sizes) {
  const GpuSpec& g = hw.gpu(gpu);
  const NcclNodeSpec& n = node_of(hw, g);
  NcclSweep s;
  s.node_name = fmt::format("{} (nccl_nodes.{})", n.name, n.key);
  s.function = func_name(f);
  s.comm = comm_of(n, ranks, gpus_per_node > 0 ? gpus_per_node : g.gpus_per_node);
  s.ranks = s.comm.ranks;
  s.nodes = s.comm.nodes;
  s.tuning = sim::nccl_tune(s.comm);
  for (std::int64_t bytes : sizes) {
    if (bytes <= 0) throw UsageError(fmt::format("a message size must be positive, not {}", bytes));
    NcclSweepRow r;
    r.bytes = bytes;
    r.choice = sim::nccl_choose(s.comm, s.tuning, f, bytes);
    r.algbw_gb_per_s = static_cast<double>(bytes) / (r.choice.time_us * 1e3);
    r.busbw_gb_per_s = busbw(f, ranks, bytes, r.choice.time_us);
    s.rows.push_back(r);
  }
  return s;
}

std::string to_text(const NcclSweep& s) {
  std::string out = fmt::format("NCCL 2.30.7's tuning model: {} over {} ranks on {} node(s) of {}\n", s.function,
                                s.ranks, s.nodes, s.node_name);
  const sim::NcclComm& c = s.comm;
  out += fmt::format("graphs: {}, {}, {}; NVLS {}, LL128 {}\n\n", graph_text("ring", c.ring),
                     graph_text("tree", c.tree), graph_text("NVLS", c.nvls_graph), c.nvls ? "on" : "off",
                     c.ll128 ? "on" : "off");
  out += fmt::format("{:>12}  {:<16}{:>12}{:>14}{:>14}\n", "size", "NCCL's choice", "time (us)", "algbw (GB/s)",
                     "busbw (GB/s)");
  for (const NcclSweepRow& r : s.rows) {
    out += fmt::format("{:>12}  {:<16}{:>12.1f}{:>14.2f}{:>14.2f}\n", format_bytes(r.bytes), r.choice.str(),
                       r.choice.time_us, r.algbw_gb_per_s, r.busbw_gb_per_s);
  }
  const sim::NcclFunc f = *nccl_function(s.function);
  out += fmt::format("\nNCCL's table for {} (latency us / bandwidth GB/s, as NCCL_DEBUG_SUBSYS=TUNING prints it; "
                     "0.0/0.0: not available)\n{:<10}{:>16}{:>16}{:>16}\n", s.function, "", "LL", "LL128", "Simple");
  for (int a = 0; a < sim::kNcclAlgos; ++a) {
    const auto algo = static_cast<sim::NcclAlgo>(a);
    if (algo == sim::NcclAlgo::collnet_direct || algo == sim::NcclAlgo::collnet_chain) continue;  // not modelled
    out += fmt::format("{:<10}", sim::nccl_algo_name(algo));
    for (int p = 0; p < sim::kNcclProtos; ++p) {
      const auto proto = static_cast<sim::NcclProto>(p);
      out += fmt::format("{:>16}", fmt::format("{:.1f}/{:.1f}", s.tuning.latency(f, algo, proto),
                                               s.tuning.bandwidth(f, algo, proto)));
    }
    out += "\n";
  }
  return out;
}

nlohmann::json to_json(const NcclSweep& s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const NcclSweepRow& r : s.rows) {
    rows.push_back({{"bytes", r.bytes}, {"algorithm", sim::nccl_algo_name(r.choice.algo)},
                    {"protocol", sim::nccl_proto_name(r.choice.proto)}, {"time_us", r.choice.time_us},
                    {"algbw_gb_per_s", r.algbw_gb_per_s}, {"busbw_gb_per_s", r.busbw_gb_per_s}});
  }
  return {{"schema", "zerocheck-nccl/1"}, {"function", s.function}, {"ranks", s.ranks}, {"nodes", s.nodes},
          {"node", s.node_name}, {"rows", rows}};
}

std::string default_nccl_published_path() {
  return data_file("plan/nccl_published.json", ZC_SOURCE_DIR).string();
}

std::vector<NcclPublished> nccl_published(const Hardware& hw, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot read {}", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
  if (j.value("schema", "") != "zerocheck-nccl-published/1") {
    throw ConfigError(fmt::format("{}: schema must be \"zerocheck-nccl-published/1\"", path));
  }
  std::vector<NcclPublished> out;
  for (std::size_t i = 0; i < j.at("rows").size(); ++i) {
    const nlohmann::json& r = j.at("rows")[i];
    const std::string where = fmt::format("{}: rows[{}]", path, i);
    try {
      NcclPublished p;
      p.system = r.at("system").get<std::string>();
      p.gpu = r.at("gpu").get<std::string>();
      p.function = r.at("function").get<std::string>();
      p.algorithm = r.value("algorithm", "");
      p.source = r.at("source").get<std::string>();
      p.ranks = r.at("ranks").get<int>();
      p.bytes = r.at("bytes").get<std::int64_t>();
      if (r.contains("time_us")) p.time_us = r.at("time_us").get<double>();
      p.busbw_gb_per_s = r.at("busbw_gb_per_s").get<double>();
      const std::optional<sim::NcclFunc> f = nccl_function(p.function);
      if (!f) throw ConfigError(fmt::format("unknown function '{}'", p.function));
      const NcclSweep s = nccl_sweep(hw, p.gpu, p.ranks, 0, *f, {});
      p.model = choose(s.comm, s.tuning, *f, p.bytes, p.algorithm);
      p.model_busbw_gb_per_s = busbw(*f, p.ranks, p.bytes, p.model.time_us);
      out.push_back(p);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("{}: {}", where, e.what()));
    } catch (const ZcError& e) {
      throw ConfigError(fmt::format("{}: {}", where, e.what()));
    }
  }
  return out;
}

std::string to_text(const std::vector<NcclPublished>& rows) {
  std::string out = "Published nccl-tests figures beside NCCL 2.30.7's tuning model (plan/nccl_published.json)\n";
  for (const NcclPublished& p : rows) {
    out += fmt::format("\n{}\n  {} of {} over {} ranks{}\n", p.system, p.function, format_bytes(p.bytes), p.ranks,
                       p.algorithm.empty() ? "" : fmt::format(" (NCCL_ALGO={})", p.algorithm));
    out += fmt::format("  measured: {}busbw {:.2f} GB/s\n",
                       p.time_us ? fmt::format("{:.1f} us, ", *p.time_us) : std::string(), p.busbw_gb_per_s);
    out += fmt::format("  model:    {:.1f} us, busbw {:.2f} GB/s, {} (busbw model/measured {:.3f})\n",
                       p.model.time_us, p.model_busbw_gb_per_s, p.model.str(),
                       p.model_busbw_gb_per_s / p.busbw_gb_per_s);
    out += fmt::format("  source:   {}\n", p.source);
  }
  return out;
}

}  // namespace zc::plan
