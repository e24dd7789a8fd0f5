// Tensor: a dtype, a shape, a placement, and a view onto storage owned by a Device. Views are
// contiguous element ranges of one Storage (flat buffers and their partitions are views); a meta
// tensor has a shape and no storage. Engine code never touches the bytes: it goes through Device.
#pragma once

#include "engine/dtype.h"
#include "engine/memory.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zc {

enum class Placement : std::uint8_t { host, cuda, meta };
std::string_view placement_name(Placement p);

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

// A block of device memory. Owned through shared_ptr by every tensor that views it; the device's
// deleter frees it. id is a per-device counter, used to name buffers without printing pointers.
// A meta allocation is a Storage without data: it gives meta tensors an identity (views, race
// checks) and a lifetime (memory accounting) with no bytes behind them.
struct Storage {
  void* data = nullptr;
  std::int64_t bytes = 0;
  Placement placement = Placement::host;
  std::uint64_t id = 0;
  std::string name;  // debug label of the allocation, e.g. "ipg_bucket_0"
  std::shared_ptr<void> owner;  // frees data when the last view is gone
  // The allocating device's ledger, told of the free when the last view is gone.
  std::shared_ptr<MemoryLedger> ledger;
  // The backend allocator's own count (HostDevice, CudaDevice), told at the same moment.
  std::shared_ptr<AllocatorStats> stats;
  MemCategory category = MemCategory::unattributed;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() { release_accounting(); }
  // Note [Stream-ordered free]
  // torch's caching allocator counts a block free (memory_allocated drops, and later allocations
  // on the stream that allocated it reuse it) as soon as the program drops its last reference,
  // though kernels queued on that stream still read it: the stream orders the reuse after them.
  // DeepSpeed relies on it where it issues a collective on a side stream and lets go of the
  // buffers at once (ZeRO-3's reduce-scatter, stage3.py __reduce_and_partition_ipg_grads). An
  // engine whose backend reads the buffer asynchronously (the simulator's rendezvous, MPI's
  // nonblocking calls) must keep it until the wait; release_accounting() counts it free in the
  // ledger and the allocator's count now, as torch's allocator does, and the storage itself is
  // freed when the last view goes. Once only.
  void release_accounting() {
    if (ledger) ledger->on_free(category, bytes);
    if (stats) stats->on_free(category, bytes);
    ledger.reset();
    stats.reset();
  }
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  Tensor(DType dtype, Shape shape, Placement placement, std::shared_ptr<Storage> storage,
         std::int64_t offset_numel = 0);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return numel_; }
  std::int64_t nbytes() const { return numel_ * dtype_size(dtype_); }
  Placement placement() const { return placement_; }
  bool is_meta() const { return placement_ == Placement::meta; }
  std::int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }

  // A flat view of elements [start, start + count) sharing this tensor's storage.
  Tensor narrow(std::int64_t start, std::int64_t count) const;
  // The same elements with another shape of equal numel.
  Tensor view(Shape shape) const;

  // Storage access for Device implementations and race checks; a meta tensor's has no data.
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::int64_t offset_numel() const { return offset_numel_; }
  std::int64_t byte_begin() const { return offset_numel_ * dtype_size(dtype_); }
  std::int64_t byte_end() const { return byte_begin() + nbytes(); }
  void* raw() const;

  // "name[lo:hi] f32", or "<meta f32[4,4]>" (with its allocation's name when it has one): for
  // error messages; never a pointer.
  std::string describe() const;
  // True when both views touch a common byte of one storage.
  bool overlaps(const Tensor& other) const;

 private:
  bool defined_ = false;
  DType dtype_ = DType::f32;
  Shape shape_;
  std::int64_t numel_ = 0;
  Placement placement_ = Placement::host;
  std::shared_ptr<Storage> storage_;
  std::int64_t offset_numel_ = 0;
};

}  // namespace zc
