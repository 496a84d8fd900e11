#include "address_space.hpp"

#include <sys/mman.h>

namespace emu {

MappedRange& MappedRange::operator=(MappedRange&& o) noexcept {
  if (this != &o) {
    if (size_ != 0) munmap(reinterpret_cast<void*>(va_), size_);
    va_ = o.va_;
    size_ = o.size_;
    o.size_ = 0;
  }
  return *this;
}

MappedRange::~MappedRange() {
  if (size_ != 0) munmap(reinterpret_cast<void*>(va_), size_);
}

std::optional<MappedRange> reserve_va(std::uint64_t size, std::uint64_t align, std::uint64_t hint) {
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (hint != 0 && hint % align == 0) {
    void* p =
        mmap(reinterpret_cast<void*>(hint), size, PROT_NONE, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED) return MappedRange(reinterpret_cast<std::uint64_t>(p), size);
  }
  // Over-reserve and trim to get the alignment.
  std::uint64_t total = size + align;
  void* p = mmap(nullptr, total, PROT_NONE, kFlags, -1, 0);
  if (p == MAP_FAILED) return std::nullopt;
  auto start = reinterpret_cast<std::uint64_t>(p);
  std::uint64_t aligned = (start + align - 1) / align * align;
  if (aligned > start) munmap(p, aligned - start);
  std::uint64_t end = start + total;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  return MappedRange(aligned, size);
}

bool map_fixed(std::uint64_t va, std::uint64_t size, const PhysicalMemory& mem,
               std::uint64_t offset, int prot) {
  void* p = mmap(reinterpret_cast<void*>(va), size, prot, MAP_SHARED | MAP_FIXED, mem.fd(),
                 static_cast<off_t>(offset));
  return p != MAP_FAILED;
}

void unmap_to_reserved(std::uint64_t va, std::uint64_t size) {
  mmap(reinterpret_cast<void*>(va), size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

namespace {
template <class Map, class SizeOf>
auto find_containing(Map& m, std::uint64_t p, SizeOf size_of) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  if (p < it->first + size_of(it->second)) return it;
  return m.end();
}
}  // namespace

CUmemAccess_flags VmmMapping::access_at(std::uint64_t p) const {
  std::uint64_t i = (p - va) / (2ull << 20);
  return i < access.size() ? access[i] : CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

Reservation* AddressSpace::reservation_of(std::uint64_t p) {
  auto it = find_containing(reservations, p, [](const Reservation& r) { return r.range.size(); });
  return it == reservations.end() ? nullptr : &it->second;
}

VmmMapping* AddressSpace::mapping_of(std::uint64_t p) {
  Reservation* r = reservation_of(p);
  if (r == nullptr) return nullptr;
  auto it = find_containing(r->mappings, p, [](const VmmMapping& m) { return m.size; });
  return it == r->mappings.end() ? nullptr : &it->second;
}

PinnedHost* AddressSpace::pinned_of(std::uint64_t p) {
  auto it = find_containing(pinned, p, [](const PinnedHost& h) { return h.size; });
  return it == pinned.end() ? nullptr : &it->second;
}

std::optional<DeviceRangeInfo> AddressSpace::device_info(std::uint64_t p) {
  if (auto it = find_containing(legacy, p, [](const LegacyAllocation& a) { return a.size; });
      it != legacy.end()) {
    return DeviceRangeInfo{it->second.mem->device(), it->second.ctx, it->first, it->second.size,
                           false};
  }
  if (auto it = find_containing(ipc, p, [](const IpcMapping& m) { return m.mem->size(); });
      it != ipc.end()) {
    return DeviceRangeInfo{it->second.mem->device(), it->second.ctx, it->first,
                           it->second.mem->size(), false};
  }
  if (VmmMapping* m = mapping_of(p)) {
    return DeviceRangeInfo{m->mem->device(), 0, m->va, m->size, true};
  }
  return std::nullopt;
}

MemoryClass AddressSpace::classify(std::uint64_t p) {
  if (device_info(p)) return MemoryClass::kDevice;
  if (pinned_of(p) != nullptr) return MemoryClass::kPinnedHost;
  return MemoryClass::kUnknownHost;
}

CUresult AddressSpace::check_device_shape(std::uint64_t p, std::uint64_t n, int* device) {
  auto info = device_info(p);
  if (!info) return CUDA_ERROR_INVALID_VALUE;
  if (device != nullptr) *device = info->device;
  if (n == 0) return CUDA_SUCCESS;
  if (p + n < p) return CUDA_ERROR_INVALID_VALUE;
  if (!info->vmm) {
    return p + n <= info->base + info->size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  // VMM: the range may span adjacent mappings (one allocation mapped in pieces, or
  // several allocations mapped back to back), but not a hole.
  std::uint64_t cur = p;
  while (cur < p + n) {
    VmmMapping* m = mapping_of(cur);
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    cur = m->va + m->size;
  }
  return CUDA_SUCCESS;
}

CUresult AddressSpace::check_device(std::uint64_t p, std::uint64_t n, bool write, int* device) {
  CUresult r = check_device_shape(p, n, device);
  if (r != CUDA_SUCCESS) return r;
  auto info = device_info(p);
  if (!info->vmm) return CUDA_SUCCESS;
  std::uint64_t cur = p;
  constexpr std::uint64_t kGranule = 2ull << 20;
  do {
    VmmMapping* m = mapping_of(cur);
    if (m == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    CUmemAccess_flags a = m->access_at(cur);
    bool ok = write ? a == CU_MEM_ACCESS_FLAGS_PROT_READWRITE : a != CU_MEM_ACCESS_FLAGS_PROT_NONE;
    if (!ok) return CUDA_ERROR_ILLEGAL_ADDRESS;
    cur = std::min(m->va + m->size, (cur / kGranule + 1) * kGranule);
  } while (cur < p + n);
  return CUDA_SUCCESS;
}

bool AddressSpace::host_range_pinned(std::uint64_t p, std::uint64_t n) {
  PinnedHost* h = pinned_of(p);
  return h != nullptr && p + n <= h->va + h->size;
}

}  // namespace emu
