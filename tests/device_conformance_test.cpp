// The Device conformance table on the host: HostDevice against ReferenceDevice, an independent
// reading of each op's comment in engine/device.h (tests/conformance/reference_device.h), so the
// table can fail on a CPU; and a negative control: a device that gets any one op slightly wrong
// (PerturbingDevice) is caught against the same reference. On a GPU the same table runs CudaDevice
// against the reference (tests/gpu_test.cpp).
#include "engine/host_device.h"
#include "tests/conformance/device_conformance.h"
#include "tests/conformance/perturbing_device.h"
#include "tests/conformance/reference_device.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace zc::conformance {
namespace {

TEST(DeviceConformance, TableCoversEveryOpAndHostDeviceMatchesTheReference) {
  const std::vector<DeviceCase> table = device_table();
  std::set<std::string> ops;
  for (const DeviceCase& c : table) ops.insert(c.op);
  EXPECT_EQ(ops.size(), 48u);  // the 49 data ops of Device, upload and download as one round trip
  EXPECT_GT(table.size(), 1500u);
  ReferenceDevice ref;
  HostDevice host;
  std::vector<std::string> failures;
  for (const DeviceCase& c : table) {
    const std::string why = run_device_case(ref, host, c);
    if (!why.empty()) failures.push_back(why);
  }
  std::string first;
  for (std::size_t i = 0; i < failures.size() && i < 20; ++i) first += failures[i] + "\n";
  EXPECT_TRUE(failures.empty()) << failures.size() << " cases disagree; the first:\n" << first;
}

TEST(DeviceConformance, CatchesADeviceThatGetsOneOpWrong) {
  std::map<std::string, std::vector<DeviceCase>> by_op;
  for (const DeviceCase& c : device_table()) by_op[c.op].push_back(c);
  for (const auto& [op, cases] : by_op) {
    ReferenceDevice ref;
    PerturbingDevice bad(op);
    int caught = 0;
    std::string first;
    for (const DeviceCase& c : cases) {
      const std::string why = run_device_case(ref, bad, c);
      if (!why.empty()) {
        ++caught;
        if (first.empty()) first = why;
        EXPECT_NE(why.find(op), std::string::npos) << why;
      }
    }
    EXPECT_GT(caught, 0) << "no case of " << op << " noticed a one-bit error in its output";
    if (op == "axpy") {
      EXPECT_NE(first.find("vs host-perturbed:axpy"), std::string::npos) << first;
    }
  }
}

TEST(DeviceConformance, ExpBoundIsTightEnoughToCatchARealError) {
  // The widest bound in the table (33 rows of 16 classes): a relative error of 2^-12 must not fit.
  const DeviceCase c{"softmax_xent", DType::f32, DType::f32, {33, 16}, 0, Domain::gaussian};
  EXPECT_EQ(ulp_factor(c), 44.0);
  EXPECT_LT(ulp_factor(c) * std::ldexp(1.0, -24), std::ldexp(1.0, -12));
}

}  // namespace
}  // namespace zc::conformance
