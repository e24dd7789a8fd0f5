#include "cli/nccl.h"

#include "engine/errors.h"
#include "plan/nccl.h"

#include <fmt/format.h>

#include <cctype>
#include <limits>

namespace zc::cli {
namespace {

// "8", "64K", "2M", "8G": bytes, binary units as nccl-tests' -b/-e read them.
std::int64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("--bytes: '{}' is not a size (8, 64K, 2M, 8G)", text));
  }
  std::int64_t scale = 1;
  if (used < text.size()) {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(text[used])));
    scale = u == 'K' ? 1LL << 10 : u == 'M' ? 1LL << 20 : u == 'G' ? 1LL << 30 : 0;
    if (scale == 0 || used + 1 != text.size()) {
      throw UsageError(fmt::format("--bytes: '{}' is not a size (8, 64K, 2M, 8G)", text));
    }
  }
  if (n <= 0 || n > std::numeric_limits<std::int64_t>::max() / scale) {
    throw UsageError(fmt::format("--bytes: '{}' must be positive and fit in 64 bits", text));
  }
  return n * scale;
}

}  // namespace

int run_nccl_cli(const NcclCliOptions& o) {
  const plan::Hardware hw = plan::load_hardware(o.hardware.empty() ? plan::default_hardware_path() : o.hardware);
  if (o.published) {
    fmt::print("{}", plan::to_text(plan::nccl_published(hw, plan::default_nccl_published_path())));
    return 0;
  }
  const std::optional<sim::NcclFunc> f = plan::nccl_function(o.function);
  if (!f) {
    throw UsageError(fmt::format("--function '{}': one of broadcast, reduce, all_gather, reduce_scatter, all_reduce",
                                 o.function));
  }
  std::vector<std::int64_t> sizes;
  for (const std::string& s : o.sizes) sizes.push_back(parse_size(s));
  if (sizes.empty()) {
    for (std::int64_t b = 8; b <= (8LL << 30); b *= 8) sizes.push_back(b);  // 8 B to 8 GiB
  }
  const plan::NcclSweep sweep = plan::nccl_sweep(hw, o.gpu, o.world_size, o.gpus_per_node, *f, sizes);
  if (o.json) {
    fmt::print("{}\n", plan::to_json(sweep).dump(2));
  } else {
    fmt::print("{}", plan::to_text(sweep));
  }
  return 0;
}

}  // namespace zc::cli
