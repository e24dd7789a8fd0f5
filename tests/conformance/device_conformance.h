// The Device conformance table: every Device op x dtypes x shapes x input domain, run from the
// same inputs on a reference (ReferenceDevice, reference_device.h: each op written from its
// comment in engine/device.h, independently of HostDevice) and a device under test (HostDevice on
// the host, CudaDevice on a GPU), outputs compared bit for bit. Written against Device only, like
// the Comm table.
//
// Domains: `exact` (small integers: every result is exactly representable, so any correct
// implementation agrees), `gaussian` (N(0,1) values: agreement needs the same IEEE operations in
// the same order, which every backend promises, engine/device.h), `special` (inf, NaN, +-0,
// subnormals, values that overflow 16-bit types: conversions and the finite checks).
//
// Bounds. Every op is bit for bit in every domain except the two that call exp/log, whose GPU
// versions are not correctly rounded (CUDA's expf <= 2 ulp and logf <= 1 ulp, exp and log in f64
// <= 1 ulp; glibc's, and the reference's, evaluated one type wider and rounded once, are within
// about half an ulp): softmax_xent and causal_softmax (in every domain: exp of an integer is not
// exact either) must agree within
//   |dut - ref| <= (12 + 2 * cols) * u * s + ulp_out(ref)
// where u = 2^-24 (f32 compute) or 2^-53 (f64), s = |ref| for probabilities and s = max(1, |ref|)
// where the output cancels (the row loss, and p - 1 in the label column of dlogits), and ulp_out
// is one unit in the last place of a 16-bit output (0 for f32/f64 outputs). Where it comes from:
// two libraries' exp of one argument differ by <= 2.5 ulp, which is <= 5u relative (an f32 ulp is
// at most 2u of the value); the denominator, a sum of `cols` such terms in the same order, by
// <= 5u + (cols - 1)u; a probability e / denom by the sum of both plus a rounding, <= (10 + cols)u;
// the loss log(denom) - (x - max) by <= (5 + cols)u + 3u |log denom| absolute. (12 + 2 cols) covers
// each. NaN compares equal to NaN (payloads are not specified across libraries); every other
// value by bits.
#pragma once

#include "engine/device.h"

#include <string>
#include <vector>

namespace zc::conformance {

enum class Domain : std::uint8_t { exact, gaussian, special };
std::string_view domain_name(Domain d);

struct DeviceCase {
  std::string op;           // "axpy", "matmul", ...
  DType dtype = DType::f32;   // the main operand's dtype
  DType dtype2 = DType::f32;  // the second dtype where an op mixes (cast's source, axpy's x, the grad)
  std::vector<std::int64_t> dims;  // op-specific sizes (n; or rows, cols; or m, n, k; ...)
  int variant = 0;          // op-specific flags (transposes, accumulate, adamw, momentum, ...)
  Domain domain = Domain::exact;
  std::string name() const;  // "matmul f32/f32 [17,5,33] v3 gaussian"
};

// Every case of the table (a few thousand, a few seconds on the host).
std::vector<DeviceCase> device_table();

// The number of units of 2^-24 (or 2^-53) the case's outputs may differ by; 0 means bit for bit.
// See the header comment for where it comes from.
double ulp_factor(const DeviceCase& c);

// Runs the case on `ref` and `dut` from identical inputs and compares every output (tensors and
// returned values). "" when they agree; otherwise the case, output, element, both values and bit
// patterns. An op that throws on one device but not the other is a disagreement too. `worst`, if
// given, receives the largest difference seen in units of u times the bound's scale (max(1, |ref|)
// for the bit-for-bit ops; 0: bit for bit).
std::string run_device_case(Device& ref, Device& dut, const DeviceCase& c, double* worst = nullptr);

}  // namespace zc::conformance
