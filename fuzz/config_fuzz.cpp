// Fuzz target: Config::from_json_text, the ds_config parser. Oracle: a config it accepts keeps
// DeepSpeed's batch identity, train_batch_size = micro batch x GA x world, with each factor >= 1.
#include "engine/config.h"
#include "fuzz/fuzz_common.h"

#include <array>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > zc::fuzz::kMaxInputBytes) return 0;
  // The world size comes from the input's length, so one input meets several worlds as it grows.
  static constexpr std::array<int, 5> kWorlds = {1, 2, 3, 1024, 1 << 22};
  const int world = kWorlds[size % kWorlds.size()];
  const std::string text(reinterpret_cast<const char*>(data), size);
  return zc::fuzz::run_contract([&] {
    const zc::Config c = zc::Config::from_json_text(text, world);
    zc::fuzz::check(c.train_micro_batch_size_per_gpu >= 1 && c.gradient_accumulation_steps >= 1,
                    "accepted config has a batch factor < 1");
    std::int64_t per_rank = 0, global = 0;
    const bool overflow =
        __builtin_mul_overflow(c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps,
                               &per_rank) ||
        __builtin_mul_overflow(per_rank, std::int64_t{world}, &global);
    zc::fuzz::check(!overflow && c.train_batch_size == global,
                    "train_batch_size != micro batch x GA x world");
  });
}
