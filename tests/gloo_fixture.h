// Replays a measurement of torch.distributed's gloo reductions (reference/deepspeed/measure_gloo.py)
// through the simulator's ReductionOrder::gloo: every all_reduce, reduce_scatter and reduce result
// must be gloo's, bit for bit. Returns "" or the first difference; counts compared elements.
#pragma once

#include "sim/reduction.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace zc::testing {

inline std::string replay_gloo_fixture(const std::string& path, std::int64_t* compared) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot read " + path;
  std::string header;
  int cases = 0;
  while (std::getline(in, header)) {
    std::istringstream h(header);
    int world = 0, root = 0;
    std::int64_t n = 0, m = 0;
    std::string dt;
    if (!(h >> world >> n >> dt >> m >> root) || world < 1 || n < 0 || m < 0 || m > n) {
      return fmt::format("{}: bad case header '{}'", path, header);
    }
    const DType dtype = dt == "f32" ? DType::f32 : DType::bf16;
    const auto bytes = static_cast<std::size_t>(n * dtype_size(dtype));
    const auto mbytes = static_cast<std::size_t>(m * dtype_size(dtype));
    std::vector<std::vector<std::byte>> x(static_cast<std::size_t>(world), std::vector<std::byte>(bytes));
    std::vector<std::byte> ar(bytes), rs(mbytes), red(bytes);
    for (auto& v : x) in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
    in.read(reinterpret_cast<char*>(ar.data()), static_cast<std::streamsize>(bytes));
    in.read(reinterpret_cast<char*>(rs.data()), static_cast<std::streamsize>(mbytes));
    in.read(reinterpret_cast<char*>(red.data()), static_cast<std::streamsize>(bytes));
    if (!in) return fmt::format("{}: case '{}' is cut short", path, header);
    std::vector<const std::byte*> ptrs;
    for (const auto& v : x) ptrs.push_back(v.data());
    std::vector<std::byte> got(bytes);
    const auto check = [&](const char* what, const std::vector<std::byte>& want, std::int64_t count) {
      const auto es = static_cast<std::size_t>(dtype_size(dtype));
      for (std::int64_t i = 0; i < count; ++i) {
        if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
          return fmt::format("{} world {} n {} {}: element {} of {} differs from gloo's", what, world, n,
                             dt, i, count);
        }
      }
      if (compared) *compared += count;
      return std::string();
    };
    sim::all_reduce_into(dtype, ReduceOp::sum, sim::ReductionOrder::gloo, ptrs, n, got.data());
    if (std::string e = check("all_reduce", ar, n); !e.empty()) return e;
    got.assign(mbytes, std::byte{0});
    const std::int64_t chunk = m / world;
    for (int r = 0; r < world; ++r) {
      sim::reduce_scatter_into(dtype, ReduceOp::sum, sim::ReductionOrder::gloo, ptrs, chunk, r,
                               got.data() + r * chunk * dtype_size(dtype));
    }
    if (std::string e = check("reduce_scatter", rs, m); !e.empty()) return e;
    got.assign(bytes, std::byte{0});
    sim::reduce_to_root_into(dtype, ReduceOp::sum, sim::ReductionOrder::gloo, ptrs, n, root, got.data());
    if (std::string e = check("reduce", red, n); !e.empty()) return e;
    ++cases;
  }
  return cases > 0 ? "" : path + ": no cases";
}

}  // namespace zc::testing
