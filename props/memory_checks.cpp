// Meta against host memory: see memory_checks.h.
#include "props/memory_checks.h"

#include "engine/errors.h"

#include <fmt/format.h>

namespace zc::props {

namespace {

std::string bytes_list(const MemBytes& b) {
  std::string out;
  for (std::size_t k = 0; k < kMemCategories; ++k) {
    if (b[k] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", mem_category_name(static_cast<MemCategory>(k)), b[k]);
  }
  return out.empty() ? "nothing" : out;
}

std::string compare_device(const DeviceMemory& meta, const DeviceMemory& host,
                           const std::string& where) {
  if (!host.allocator_construction || !host.allocator_steps) {
    return where + ": the device kept no allocator stats";
  }
  std::string d = memory_difference(meta.construction, *host.allocator_construction,
                                    where + ", construction");
  if (d.empty()) d = memory_difference(meta.steps, *host.allocator_steps, where + ", steps");
  return d;
}

}  // namespace

std::string memory_difference(const MemoryLedger& meta, const AllocatorStats& host,
                              const std::string& where) {
  for (std::size_t k = 0; k < kMemCategories; ++k) {
    if (meta.peak()[k] != host.peak[k]) {
      const bool named = static_cast<MemCategory>(k) == MemCategory::unattributed && !host.unattributed_label.empty();
      return fmt::format("{}: peak of {} is {} bytes in meta mode but the allocator held {}{}",
                         where, mem_category_name(static_cast<MemCategory>(k)), meta.peak()[k],
                         host.peak[k], named ? fmt::format(" (the latest: '{}')", host.unattributed_label) : "");
    }
  }
  if (meta.peak_total() != host.peak_total) {
    return fmt::format("{}: total peak {} bytes in meta mode, {} counted by the allocator", where,
                       meta.peak_total(), host.peak_total);
  }
  if (meta.at_peak() != host.at_peak) {
    return fmt::format("{}: at the peak, meta holds {} but the allocator held {}", where,
                       bytes_list(meta.at_peak()), bytes_list(host.at_peak));
  }
  return "";
}

namespace {
RunSpec without_readbacks(RunSpec spec) {
  spec.collect_grads = false;  // the records' getters allocate; meta mode reads nothing back
  spec.record_values = false;
  return spec;
}
}  // namespace

MemoryComparison compare_meta_with_backend(const RunSpec& spec, Device& dev, Device& cpu, Comm& world) {
  MemoryComparison c;
  RunSpec mine = without_readbacks(spec);
  ZC_ASSERT(mine.world == world.size(), "a spec for {} ranks run on a world of {}", mine.world, world.size());
  for (Device* d : {&dev, &cpu}) {  // both counts start from nothing, as the meta run's do
    const AllocatorStats* a = d->allocator_stats();
    if (a != nullptr && a->live_total != 0) {
      c.difference = fmt::format("rank {}: {} holds {} bytes before the run; free them first", world.rank(),
                                 d->name(), a->live_total);
      return c;
    }
    d->reset_peak();
  }
  const RankRecord got = train_rank(mine, world.rank(), dev, world, nullptr, &cpu);
  mine.sim.meta = true;
  const RunResult meta = run_on_sim(mine);
  const auto r = static_cast<std::size_t>(world.rank());
  const std::string rank = fmt::format("rank {}", world.rank());
  c.trace_hash = meta.sim.trace_hash;
  c.peak_bytes = meta.memory.at(r).device.steps.peak_total();
  c.difference = compare_device(meta.memory.at(r).device, got.memory.device, rank + " " + dev.name());
  if (c.difference.empty()) c.difference = compare_device(meta.memory.at(r).cpu, got.memory.cpu, rank + " cpu");
  return c;
}

MemoryComparison compare_meta_with_host(const RunSpec& host) {
  ZC_ASSERT(!host.sim.meta, "compare_meta_with_host takes the host run's spec");
  MemoryComparison c;
  RunSpec host_spec = without_readbacks(host);
  RunSpec meta = host_spec;
  meta.sim.meta = true;
  RunResult h, m;
  try {
    h = run_on_sim(host_spec);
  } catch (const std::exception& e) {
    c.applies = false;
    c.why_not = std::string("the host run failed: ") + e.what();
    return c;
  }
  for (std::int64_t skipped : h.skipped_steps) {
    if (skipped > 0) {
      c.applies = false;  // meta mode never overflows (Note [Meta mode])
      c.why_not = "the host run skipped a step for overflow, a path meta mode does not take";
      return c;
    }
  }
  try {
    m = run_on_sim(meta);
  } catch (const std::exception& e) {
    c.trace_hash = h.sim.trace_hash;
    c.difference = std::string("the meta run failed where the host run did not: ") + e.what();
    return c;
  }
  c.trace_hash = mix64(h.sim.trace_hash, m.sim.trace_hash);
  c.peak_bytes = m.memory.at(0).device.steps.peak_total();
  for (std::size_t r = 0; r < h.memory.size() && c.difference.empty(); ++r) {
    const std::string rank = fmt::format("rank {}", r);
    c.difference = compare_device(m.memory[r].device, h.memory[r].device, rank + " device");
    if (c.difference.empty()) {
      c.difference = compare_device(m.memory[r].cpu, h.memory[r].cpu, rank + " cpu");
    }
  }
  if (c.difference.empty() && h.comm.size() == m.comm.size()) {
    for (std::size_t r = 0; r < h.comm.size(); ++r) {
      if (h.comm[r].to_string() != m.comm[r].to_string()) {
        c.difference = fmt::format("rank {}: collectives differ: host {}, meta {}", r,
                                   h.comm[r].to_string(), m.comm[r].to_string());
        break;
      }
    }
  }
  return c;
}

}  // namespace zc::props
