// main() for RapidCheck properties: pins the seed (ZC_PROP_SEED, else a fixed default) so CI is
// reproducible, prints it, and on any failure prints a one-line replay command.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

std::string g_binary;
std::string g_seed;

class ReplayPrinter : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::printf("replay: RC_PARAMS=\"seed=%s\" %s --gtest_filter=%s.%s\n", g_seed.c_str(),
                g_binary.c_str(), info.test_suite_name(), info.name());
    std::printf("        (or RapidCheck's reproduce string printed above, for the shrunk case)\n");
  }
};

}  // namespace

int main(int argc, char** argv) {
  g_binary = argv[0];
  const char* params = std::getenv("RC_PARAMS");
  if (params == nullptr || std::string(params).find("seed=") == std::string::npos) {
    const char* env_seed = std::getenv("ZC_PROP_SEED");
    g_seed = env_seed != nullptr ? env_seed : "20261129";
    const std::string merged =
        (params != nullptr ? std::string(params) + " " : std::string()) + "seed=" + g_seed;
    setenv("RC_PARAMS", merged.c_str(), 1);
  } else {
    const std::string p(params);
    const std::size_t at = p.find("seed=") + 5;
    g_seed = p.substr(at, p.find(' ', at) - at);
  }
  std::printf("zerocheck properties: RapidCheck seed %s (set ZC_PROP_SEED to vary)\n",
              g_seed.c_str());
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new ReplayPrinter);
  return RUN_ALL_TESTS();
}
