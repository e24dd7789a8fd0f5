// plan/hardware.json: device, network and host figures with their sources (the file says where
// each comes from); read strictly, so a misspelt key or a missing figure is an error naming it.
#include "engine/data_files.h"
#include "engine/errors.h"
#include "plan/plan.h"

#include <fmt/format.h>

#include <fstream>

namespace zc::plan {

namespace {

template <class T>
const T& find_key(const std::vector<T>& items, const std::string& key, const char* what,
                  const std::string& path) {
  for (const T& t : items) {
    if (t.key == key) return t;
  }
  std::string known;
  for (const T& t : items) known += (known.empty() ? "" : ", ") + t.key;
  throw ConfigError(fmt::format("unknown {} '{}' (known in {}: {})", what, key, path, known));
}

double number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j.at(key).is_number()) {
    throw ConfigError(fmt::format("{}: '{}' must be a number", where, key));
  }
  return j.at(key).get<double>();
}

sim::NcclGraph nccl_graph(const nlohmann::json& j, const char* key, const std::string& where) {
  const std::string at = fmt::format("{}.{}", where, key);
  if (!j.contains(key) || !j.at(key).is_object()) throw ConfigError(fmt::format("{}: '{}' must be an object", where, key));
  const nlohmann::json& g = j.at(key);
  sim::NcclGraph out;
  const double channels = number(g, "channels", at);
  if (channels < 0 || channels > 64 || channels != static_cast<int>(channels)) {
    throw ConfigError(fmt::format("{}: 'channels' must be a whole number from 0 to 64 (NCCL's MAXCHANNELS)", at));
  }
  out.channels = static_cast<int>(channels);
  out.bw_intra = static_cast<float>(number(g, "bw_intra", at));
  out.bw_inter = static_cast<float>(number(g, "bw_inter", at));
  if (out.channels > 0 && (out.bw_intra <= 0 || out.bw_inter <= 0)) {
    throw ConfigError(fmt::format("{}: a graph with channels needs positive bw_intra and bw_inter (GB/s per channel)", at));
  }
  return out;
}

NcclNodeSpec nccl_node_spec(const std::string& key, const nlohmann::json& n, const std::string& where) {
  NcclNodeSpec s;
  s.key = key;
  s.name = n.value("name", key);
  sim::NcclNode& node = s.node;
  node.comp_cap = static_cast<int>(number(n, "compute_capability", where) * 10 + 0.5);
  const std::string cpu = n.value("cpu", "");
  if (cpu != "intel" && cpu != "amd") throw ConfigError(fmt::format("{}: 'cpu' must be \"intel\" or \"amd\"", where));
  node.amd_cpu = cpu == "amd";
  node.nvls = n.at("nvls").get<bool>();
  node.ll128 = n.at("ll128").get<bool>();
  const nlohmann::json& one = n.at("one_node");
  const nlohmann::json& many = n.at("nodes");
  node.ring_one_node = nccl_graph(one, "ring", where + ".one_node");
  node.tree_one_node = nccl_graph(one, "tree", where + ".one_node");
  node.nvls_one_node = nccl_graph(one, "nvls", where + ".one_node");
  node.ring_nodes = nccl_graph(many, "ring", where + ".nodes");
  node.tree_nodes = nccl_graph(many, "tree", where + ".nodes");
  node.nvls_nodes = nccl_graph(many, "nvls", where + ".nodes");
  if (node.ring_one_node.channels == 0 || node.ring_nodes.channels == 0 || node.tree_one_node.channels == 0 ||
      node.tree_nodes.channels == 0) {
    throw ConfigError(fmt::format("{}: the ring and tree graphs need at least one channel", where));
  }
  return s;
}

}  // namespace

const GpuSpec& Hardware::gpu(const std::string& key) const {
  return find_key(gpus, key, "--gpu", path);
}
const NetworkSpec& Hardware::network(const std::string& key) const {
  return find_key(networks, key, "network", path);
}
const HostSpec& Hardware::host(const std::string& key) const {
  return find_key(hosts, key, "host", path);
}
const NcclNodeSpec& Hardware::nccl_node(const std::string& key) const {
  return find_key(nccl_nodes, key, "nccl node", path);
}

std::string default_hardware_path() { return data_file("plan/hardware.json", ZC_SOURCE_DIR).string(); }

Hardware load_hardware(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot read the hardware file {} (--hardware)", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
  if (j.value("schema", "") != "zerocheck-hardware/1") {
    throw ConfigError(fmt::format("{}: schema must be \"zerocheck-hardware/1\"", path));
  }
  Hardware hw;
  hw.path = path;
  for (const auto& [key, g] : j.at("gpus").items()) {
    const std::string where = fmt::format("{}: gpus.{}", path, key);
    GpuSpec s;
    s.key = key;
    s.name = g.value("name", key);
    s.memory_bytes = static_cast<std::int64_t>(number(g, "memory_bytes", where));
    s.compute_capability = number(g, "compute_capability", where);
    const nlohmann::json& t = g.at("peak_tflops");
    s.bf16_tflops = number(t, "bf16", where + ".peak_tflops");
    s.fp16_tflops = number(t, "fp16", where + ".peak_tflops");
    s.fp32_tflops = number(t, "fp32", where + ".peak_tflops");
    s.hbm_gb_per_s = number(g, "hbm_gb_per_s", where);
    s.nvlink_gb_per_s = number(g, "nvlink_gb_per_s", where);
    const nlohmann::json& nd = j.at("node_defaults").at(key);
    s.gpus_per_node = nd.at("gpus_per_node").get<int>();
    s.inter_node = nd.at("inter_node").get<std::string>();
    s.host = nd.at("host").get<std::string>();
    s.nccl_node = nd.value("nccl", "");
    hw.gpus.push_back(s);
  }
  for (const auto& [key, n] : j.at("networks").items()) {
    const std::string where = fmt::format("{}: networks.{}", path, key);
    if (key == "nvlink") {
      hw.nvlink_alpha_us = number(n, "alpha_us", where);
      continue;
    }
    hw.networks.push_back({key, n.value("name", key), number(n, "gb_per_s", where),
                           number(n, "alpha_us", where)});
  }
  for (const auto& [key, h] : j.at("hosts").items()) {
    const std::string where = fmt::format("{}: hosts.{}", path, key);
    hw.hosts.push_back({key, h.value("name", key), number(h, "cpu_gb_per_s_per_gpu", where),
                        number(h, "cpu_tflops_per_gpu", where), number(h, "pcie_gb_per_s", where)});
  }
  if (j.contains("nccl_nodes")) {
    for (const auto& [key, n] : j.at("nccl_nodes").items()) {
      hw.nccl_nodes.push_back(nccl_node_spec(key, n, fmt::format("{}: nccl_nodes.{}", path, key)));
    }
  }
  hw.compute_efficiency = number(j.at("efficiency"), "compute", path + ": efficiency");
  hw.bus_efficiency = number(j.at("efficiency"), "bus", path + ": efficiency");
  for (const GpuSpec& g : hw.gpus) {  // every default names something the file defines
    hw.network(g.inter_node);
    hw.host(g.host);
    if (!g.nccl_node.empty()) hw.nccl_node(g.nccl_node);
  }
  return hw;
}

}  // namespace zc::plan
