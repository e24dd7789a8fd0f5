// The CPU side of ZeRO-Offload: a second memory space with its own host device (where
// DeepSpeedCPUAdam runs). In the simulator both sides are host memory, but every transfer between
// them is a real copy issued through the accelerator Device (so the race detector sees it) and
// is counted here.
#pragma once

#include "engine/host_device.h"

namespace zc {

struct OffloadStats {
  std::int64_t to_cpu_bytes = 0;
  std::int64_t to_device_bytes = 0;
  std::int64_t transfers = 0;
};

class CpuSpace {
 public:
  // `cpu` is the CPU device the environment hands in (Options::cpu_device: a meta device in meta
  // mode, so that the CPU side is counted and never allocated); null: one of its own.
  CpuSpace(Device& accel, Device* cpu) : accel_(accel), cpu_(cpu != nullptr ? cpu : &own_) {}
  CpuSpace(const CpuSpace&) = delete;
  CpuSpace& operator=(const CpuSpace&) = delete;
  Tensor alloc(DType dtype, Shape shape, std::string label, MemCategory category) {
    return cpu_->alloc(dtype, std::move(shape), "cpu:" + label, category);
  }
  // dst (cpu) = src (device), converting dtype if they differ.
  void to_cpu(const Tensor& dst, const Tensor& src) {
    accel_.cast(dst, src);
    stats_.to_cpu_bytes += dst.nbytes();
    ++stats_.transfers;
  }
  // dst (device) = src (cpu), converting dtype if they differ.
  void to_device(const Tensor& dst, const Tensor& src) {
    accel_.cast(dst, src);
    stats_.to_device_bytes += src.nbytes();
    ++stats_.transfers;
  }
  Device& cpu() { return *cpu_; }
  const OffloadStats& stats() const { return stats_; }

 private:
  Device& accel_;
  HostDevice own_;
  Device* cpu_;
  OffloadStats stats_;
};

}  // namespace zc
