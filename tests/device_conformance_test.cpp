// The Device conformance table on the host: it runs every case (HostDevice against itself, which
// exercises every runner and input), and it catches a device that gets any one op slightly wrong
// (PerturbingDevice, the negative control). On a GPU the same table runs against CudaDevice
// (tests/gpu_test.cpp).
#include "engine/host_device.h"
#include "tests/conformance/device_conformance.h"
#include "tests/conformance/perturbing_device.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace zc::conformance {
namespace {

TEST(DeviceConformance, TableCoversEveryOpAndPassesOnTheReference) {
  const std::vector<DeviceCase> table = device_table();
  std::set<std::string> ops;
  for (const DeviceCase& c : table) ops.insert(c.op);
  EXPECT_EQ(ops.size(), 31u);  // the 32 data ops of Device, upload and download as one round trip
  EXPECT_GT(table.size(), 1500u);
  HostDevice a, b;
  for (const DeviceCase& c : table) {
    const std::string why = run_device_case(a, b, c);
    ASSERT_EQ(why, "") << c.name();
  }
}

TEST(DeviceConformance, CatchesADeviceThatGetsOneOpWrong) {
  std::map<std::string, std::vector<DeviceCase>> by_op;
  for (const DeviceCase& c : device_table()) by_op[c.op].push_back(c);
  for (const auto& [op, cases] : by_op) {
    HostDevice ref;
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
