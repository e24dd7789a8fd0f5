// The conformance table's cases, inputs, expectations and bitwise comparison.
#include "tests/conformance/comm_conformance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace zc::conformance {

std::string Case::name() const {
  std::string s = fmt::format("{} {} count={}", collective_name(kind), dtype_name(dtype), count);
  if (kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter ||
      kind == CollectiveKind::reduce) {
    s += fmt::format(" {}", reduce_op_name(op));
  }
  if (kind == CollectiveKind::reduce || kind == CollectiveKind::broadcast) {
    s += fmt::format(" root={}", root);
  }
  if (in_place) s += " in-place";
  if (async_op) s += " async";
  return s;
}

std::vector<Case> table(int world) {
  std::vector<Case> cases;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64, DType::u8};
  const std::int64_t counts[] = {0, 1, 7, 64, 1027};  // 7 and 1027 divide by few worlds
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
  const int roots[] = {0, world - 1};
  for (DType dt : dtypes) {
    for (std::int64_t n : counts) {
      const bool async_op = (n % 2) == 1;  // odd counts go async, to cover Work::wait()
      for (ReduceOp op : ops) {
        cases.push_back({CollectiveKind::all_reduce, dt, n, op, 0, true, async_op});  // inout only
      }
      for (bool ip : {false, true}) {
        for (ReduceOp op : ops) {
          cases.push_back({CollectiveKind::reduce_scatter, dt, n, op, 0, ip, async_op});
        }
        cases.push_back({CollectiveKind::all_gather, dt, n, ReduceOp::sum, 0, ip, async_op});
      }
      cases.push_back({CollectiveKind::all_to_all, dt, n, ReduceOp::sum, 0, false, async_op});
      for (int root : roots) {
        for (ReduceOp op : ops) {
          cases.push_back({CollectiveKind::reduce, dt, n, op, root, true, false});
        }
        cases.push_back({CollectiveKind::broadcast, dt, n, ReduceOp::sum, root, true, true});
      }
    }
  }
  return cases;
}

double input_value(int rank, std::int64_t i, DType dtype) {
  // -5..5, or 0..10 for an unsigned dtype (a sum over 8 ranks stays below 256)
  return static_cast<double>((rank * 7 + i * 3 + (i / 5)) % 11 - (dtype == DType::u8 ? 0 : 5));
}

namespace {

double reduce_all(ReduceOp op, int world, std::int64_t i, DType dtype) {
  double acc = input_value(0, i, dtype);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(r, i, dtype);
    acc = op == ReduceOp::sum ? acc + v : op == ReduceOp::max ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

std::vector<double> inputs_for(int rank, std::int64_t n, DType dtype, std::int64_t offset = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = input_value(rank, offset + i, dtype);
  return v;
}

// The exact expected output of this rank, and its input of the full buffer size.
struct Plan {
  std::vector<double> input;     // what this rank sends
  std::vector<double> expected;  // what its output must hold
};

Plan plan_for(const Case& c, int rank, int world) {
  const std::int64_t n = c.count;
  Plan p;
  switch (c.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce:
      p.input = inputs_for(rank, n, c.dtype);
      p.expected = p.input;  // non-roots of reduce keep their buffer
      if (c.kind == CollectiveKind::all_reduce || rank == c.root) {
        for (std::int64_t i = 0; i < n; ++i) p.expected[static_cast<std::size_t>(i)] = reduce_all(c.op, world, i, c.dtype);
      }
      break;
    case CollectiveKind::reduce_scatter:
      p.input = inputs_for(rank, n * world, c.dtype);
      for (std::int64_t i = 0; i < n; ++i) p.expected.push_back(reduce_all(c.op, world, rank * n + i, c.dtype));
      break;
    case CollectiveKind::all_gather:
      p.input = inputs_for(rank, n, c.dtype);
      for (int r = 0; r < world; ++r) {
        for (double v : inputs_for(r, n, c.dtype)) p.expected.push_back(v);
      }
      break;
    case CollectiveKind::broadcast:
      p.input = inputs_for(rank, n, c.dtype);
      p.expected = inputs_for(c.root, n, c.dtype);
      break;
    case CollectiveKind::all_to_all:
      p.input = inputs_for(rank, n * world, c.dtype);
      for (int r = 0; r < world; ++r) {
        for (double v : inputs_for(r, n, c.dtype, rank * n)) p.expected.push_back(v);
      }
      break;
    default: break;
  }
  return p;
}

// Issues the case's collective. `in` and `out` are views of one buffer when the case is in-place.
WorkPtr issue(Comm& comm, const Case& c, const Tensor& in, const Tensor& out) {
  switch (c.kind) {
    case CollectiveKind::all_reduce: return comm.all_reduce(out, {c.op, c.async_op});
    case CollectiveKind::reduce_scatter: return comm.reduce_scatter(out, in, {c.op, c.async_op});
    case CollectiveKind::all_gather: return comm.all_gather(out, in, {c.async_op});
    case CollectiveKind::reduce: return comm.reduce(out, {c.op, c.root, c.async_op});
    case CollectiveKind::broadcast: return comm.broadcast(out, {c.root, c.async_op});
    case CollectiveKind::all_to_all: return comm.all_to_all(out, in, {c.async_op});
    default: return nullptr;
  }
}

std::string compare(const Case& c, int rank, Device& dev, const Tensor& out,
                    const std::vector<double>& expected) {
  const std::vector<std::byte> got = to_bytes(dev, out);
  std::vector<std::byte> want(got.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    store_from_f64(want.data(), c.dtype, static_cast<std::int64_t>(i), expected[i]);
  }
  const std::size_t esz = static_cast<std::size_t>(dtype_size(c.dtype));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(got.data() + i * esz, want.data() + i * esz, esz) != 0) {
      std::uint64_t gb = 0, wb = 0;
      std::memcpy(&gb, got.data() + i * esz, esz);
      std::memcpy(&wb, want.data() + i * esz, esz);
      return fmt::format("{}: rank {} element {}: got {} (0x{:x}) expected {} (0x{:x})", c.name(),
                         rank, i, load_as_f64(got.data(), c.dtype, static_cast<std::int64_t>(i)), gb,
                         expected[i], wb);
    }
  }
  return "";
}

}  // namespace

std::string run_case(Comm& comm, Device& dev, const Case& c) {
  const int world = comm.size();
  const int rank = comm.rank();
  const Plan p = plan_for(c, rank, world);
  const std::int64_t in_n = static_cast<std::int64_t>(p.input.size());
  const std::int64_t out_n = static_cast<std::int64_t>(p.expected.size());
  const bool inout_only = c.kind == CollectiveKind::all_reduce || c.kind == CollectiveKind::reduce ||
                          c.kind == CollectiveKind::broadcast;
  if (c.in_place != inout_only && c.kind != CollectiveKind::reduce_scatter &&
      c.kind != CollectiveKind::all_gather) {
    return fmt::format("{}: the table names a form Comm does not have for {}", c.name(),
                       collective_name(c.kind));
  }
  Tensor in, out;
  if (inout_only) {
    out = tensor_from_f64(dev, c.dtype, {in_n}, p.input, "inout");
    in = out;
  } else if (c.in_place && c.kind == CollectiveKind::reduce_scatter) {
    in = tensor_from_f64(dev, c.dtype, {in_n}, p.input, "sendrecv");  // out = in[rank*n, +n)
    out = in.narrow(rank * c.count, c.count);
  } else if (c.in_place && c.kind == CollectiveKind::all_gather) {
    out = dev.alloc(c.dtype, {out_n}, "sendrecv");  // in = out[rank*n, +n)
    in = out.narrow(rank * c.count, c.count);
    write_f64(dev, in, p.input);
  } else {
    in = tensor_from_f64(dev, c.dtype, {in_n}, p.input, "send");
    out = dev.alloc(c.dtype, {out_n}, "recv");
  }
  if (c.count > 0 && in.overlaps(out) != c.in_place) {
    return fmt::format("{}: the harness built {} buffers", c.name(), c.in_place ? "distinct" : "shared");
  }
  WorkPtr work = issue(comm, c, in, out);
  if (work) work->wait();
  const std::string got = compare(c, rank, dev, out, p.expected);
  if (!got.empty() || c.in_place) return got;
  const std::string input = compare(c, rank, dev, in, p.input);  // out of place: in is only read
  return input.empty() ? "" : "input modified: " + input;
}

}  // namespace zc::conformance
