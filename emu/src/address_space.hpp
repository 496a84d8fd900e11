// The emulated unified address space: which host address ranges are device memory
// (cuMemAlloc allocations, VMM reservations and their mappings, IPC mappings) and
// which are pinned host memory. Device pointers are host addresses, so copies are
// memcpy once a range has been checked the way a GPU's MMU would check it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "physical.hpp"

namespace emu {

// An mmap'd range we own; unmapped on destruction.
class MappedRange {
 public:
  MappedRange() = default;
  MappedRange(std::uint64_t va, std::uint64_t size) : va_(va), size_(size) {}
  MappedRange(MappedRange&& o) noexcept : va_(o.va_), size_(o.size_) { o.size_ = 0; }
  MappedRange& operator=(MappedRange&& o) noexcept;
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  ~MappedRange();
  std::uint64_t va() const { return va_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t release() {
    size_ = 0;
    return va_;
  }

 private:
  std::uint64_t va_ = 0;
  std::uint64_t size_ = 0;
};

// Reserves `size` bytes of PROT_NONE address space aligned to `align`, at `hint` if free.
std::optional<MappedRange> reserve_va(std::uint64_t size, std::uint64_t align,
                                      std::uint64_t hint = 0);
// Maps `size` bytes of `mem` at offset `offset` over [va, va+size) with `prot`.
bool map_fixed(std::uint64_t va, std::uint64_t size, const PhysicalMemory& mem,
               std::uint64_t offset, int prot);
// Replaces [va, va+size) with PROT_NONE anonymous memory (keeps the VA reserved).
void unmap_to_reserved(std::uint64_t va, std::uint64_t size);

struct LegacyAllocation {  // cuMemAlloc
  MappedRange range;
  std::uint64_t size = 0;  // as requested
  std::uint64_t ctx = 0;
  std::shared_ptr<PhysicalMemory> mem;
};

struct IpcMapping {  // cuIpcOpenMemHandle
  MappedRange range;
  std::uint64_t ctx = 0;
  int refs = 1;
  std::shared_ptr<PhysicalMemory> mem;
};

struct VmmMapping {  // cuMemMap
  std::uint64_t va = 0;
  std::uint64_t size = 0;
  std::uint64_t offset = 0;
  std::shared_ptr<PhysicalMemory> mem;
  // Access per 2 MiB granule: cuMemSetAccess may cover part of a mapping.
  std::vector<CUmemAccess_flags> access;
  CUmemAccess_flags access_at(std::uint64_t p) const;
};

struct Reservation {  // cuMemAddressReserve
  MappedRange range;
  std::map<std::uint64_t, VmmMapping> mappings;  // by va
};

struct PinnedHost {  // cuMemHostAlloc / cuMemAllocHost / cuMemHostRegister
  std::uint64_t va = 0;
  std::uint64_t size = 0;
  unsigned flags = 0;
  bool registered = false;  // user memory; else we allocated it
  std::uint64_t ctx = 0;
  MappedRange owned;  // when allocated by us
};

enum class MemoryClass { kUnknownHost, kPinnedHost, kDevice };

struct DeviceRangeInfo {
  int device = 0;
  std::uint64_t ctx = 0;   // 0 for VMM memory (not owned by a context)
  std::uint64_t base = 0;  // allocation (or mapping) start
  std::uint64_t size = 0;
  bool vmm = false;
};

class AddressSpace {
 public:
  std::map<std::uint64_t, LegacyAllocation> legacy;
  std::map<std::uint64_t, IpcMapping> ipc;
  std::map<std::uint64_t, Reservation> reservations;
  std::map<std::uint64_t, PinnedHost> pinned;

  Reservation* reservation_of(std::uint64_t p);
  VmmMapping* mapping_of(std::uint64_t p);
  PinnedHost* pinned_of(std::uint64_t p);
  std::optional<DeviceRangeInfo> device_info(std::uint64_t p);
  MemoryClass classify(std::uint64_t p);

  // Checks [p, p+n) for a driver-performed access (copy, memset):
  //   CUDA_ERROR_INVALID_VALUE   if it is not entirely device memory of one allocation
  //                              (or contiguous VMM mappings);
  //   CUDA_ERROR_ILLEGAL_ADDRESS if mapped but without the needed access (a GPU fault).
  CUresult check_device(std::uint64_t p, std::uint64_t n, bool write, int* device = nullptr);
  // Same shape check without access (used when enqueuing; access is checked on execution).
  CUresult check_device_shape(std::uint64_t p, std::uint64_t n, int* device = nullptr);
  bool host_range_pinned(std::uint64_t p, std::uint64_t n);
};

}  // namespace emu
