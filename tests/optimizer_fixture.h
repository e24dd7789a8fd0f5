// Reads and replays reference/deepspeed/measure_optimizers.py's fixture: what the installed
// DeepSpeed's CPU Adam and torch's SGD computed, step by step, as f32 bit patterns. Replay runs zerocheck's BaseOptimizer
// (running beta products included) on the same inputs and names the first differing bit.
#pragma once

#include "engine/host_device.h"
#include "engine/optimizer.h"

#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace zc::testing {

struct OptimizerFixtureCase {
  std::map<std::string, std::string> attrs;  // kernel, n, adamw, wd, lr, b1, b2, eps, steps
  std::map<std::string, std::vector<std::uint32_t>> rows;  // p0, g1, p1, m1, v1, ...
};

struct OptimizerFixture {
  std::string header;
  int simd_width = 0;
  std::vector<OptimizerFixtureCase> cases;
};

inline OptimizerFixture read_optimizer_fixture(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the optimizer fixture " + path);
  OptimizerFixture f;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "#") {
      f.header = line;
      const auto at = line.find("simd_width ");
      if (at != std::string::npos) f.simd_width = std::stoi(line.substr(at + 11));
    } else if (key == "case") {
      OptimizerFixtureCase c;
      std::string kv;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        c.attrs[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      f.cases.push_back(std::move(c));
    } else {
      if (f.cases.empty()) throw std::runtime_error("optimizer fixture: row before any case: " + key);
      std::vector<std::uint32_t>& row = f.cases.back().rows[key];
      std::string hex;
      while (ls >> hex) row.push_back(static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16)));
    }
  }
  if (f.cases.empty() || f.simd_width == 0) throw std::runtime_error("optimizer fixture " + path + " is empty or has no simd_width");
  return f;
}

// Replays one case; returns "" when every bit of every step matches, else the first difference.
inline std::string replay_optimizer_case(const OptimizerFixtureCase& c, int simd_width, std::int64_t* compared = nullptr) {
  const std::int64_t n = std::stoll(c.attrs.at("n"));
  const int steps = std::stoi(c.attrs.at("steps"));
  const bool sgd = c.attrs.at("kernel") == "torch_sgd";
  OptimizerConfig oc;
  oc.lr = std::stod(c.attrs.at("lr"));
  oc.weight_decay = std::stod(c.attrs.at("wd"));
  if (sgd) {
    oc.type = OptimizerType::sgd;
    oc.momentum = std::stod(c.attrs.at("momentum"));
    oc.dampening = std::stod(c.attrs.at("dampening"));
    oc.nesterov = c.attrs.at("nesterov") == "1";
  } else {
    oc.type = OptimizerType::adam;
    oc.beta1 = std::stod(c.attrs.at("b1"));
    oc.beta2 = std::stod(c.attrs.at("b2"));
    oc.eps = std::stod(c.attrs.at("eps"));
    oc.adam_w_mode = c.attrs.at("adamw") == "1";
  }
  HostDevice dev;
  BaseOptimizer opt(oc, dev, n, "fixture", simd_width);
  Tensor p = dev.alloc(DType::f32, {n}), g = dev.alloc(DType::f32, {n});
  auto upload = [&](const Tensor& t, const std::vector<std::uint32_t>& bits) {
    if (static_cast<std::int64_t>(bits.size()) != n) throw std::runtime_error("optimizer fixture: row length != n");
    dev.upload(t, std::as_bytes(std::span(bits)));
  };
  auto download = [&](const Tensor& t) {
    std::vector<std::uint32_t> out(static_cast<std::size_t>(n));
    dev.download(std::as_writable_bytes(std::span(out)), t);
    return out;
  };
  upload(p, c.rows.at("p0"));
  for (int s = 1; s <= steps; ++s) {
    upload(g, c.rows.at(fmt::format("g{}", s)));
    opt.step(p, g);
    std::vector<std::pair<const char*, Tensor>> got{{"p", p}};
    if (!sgd) got.insert(got.end(), {{"m", opt.exp_avg()}, {"v", opt.exp_avg_sq()}});
    if (sgd && oc.momentum != 0.0) got.emplace_back("b", opt.exp_avg());
    for (const auto& [name, t] : got) {
      const std::vector<std::uint32_t> want = c.rows.at(fmt::format("{}{}", name, s)), have = download(t);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        if (compared != nullptr) ++*compared;
        if (want[k] != have[k]) {
          std::string what;
          for (const auto& [key, value] : c.attrs) what += fmt::format("{}={} ", key, value);
          return fmt::format("{}step {} {}[{}]: measured {:08x} ({}), zerocheck {:08x} ({})", what, s, name, i, want[k],
                             std::bit_cast<float>(want[k]), have[k], std::bit_cast<float>(have[k]));
        }
      }
    }
  }
  return {};
}

}  // namespace zc::testing
