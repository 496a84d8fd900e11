// Virtual memory management: physical allocations (cuMemCreate), address reservations,
// mappings, access, and sharing handles across processes as POSIX file descriptors.
//
// The rules enforced here are the driver documentation's: sizes, addresses and offsets
// are multiples of the granularity; a mapping grants no access until cuMemSetAccess;
// cuMemUnmap takes whole mappings; cuMemRelease may come while mapped.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "api_common.hpp"

using namespace emu;

namespace {

using Lock = std::unique_lock<std::shared_mutex>;

// Charges the page latency of `bytes` to the calling thread, from `t0` on.
void charge_pages(Clock::time_point t0, std::uint64_t bytes) {
  if (!driver().timing()) return;
  wait_until(t0 + driver().cfg().page_latency * static_cast<long>(bytes / kGranularity));
}

CUresult check_prop(const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (raw(prop->type) != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  switch (raw(prop->location.type)) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (!valid_device(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
      break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      return CUDA_ERROR_INVALID_VALUE;  // documented for cuMemCreate
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      // HOST allocations are not IPC capable: handle types there are invalid.
      if (prop->requestedHandleTypes != 0) return CUDA_ERROR_INVALID_VALUE;
      // Host-located VMM memory (NCCL uses it) is not emulated; the device attributes
      // HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and friends say 0 accordingly.
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

constexpr unsigned kKnownHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                       CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT |
                                       CU_MEM_HANDLE_TYPE_FABRIC;

// Drops values whose memory is gone (unmapped after its last release).
void prune_handles_locked() {
  auto& d = driver();
  std::erase_if(d.vmm_handles, [&](auto& kv) {
    if (kv.second.refs > 0 || !kv.second.weak.expired()) return false;
    return true;
  });
  d.vmm_handle_of.clear();
  for (auto& [h, ref] : d.vmm_handles) {
    if (auto m = ref.weak.lock()) d.vmm_handle_of[m.get()] = h;
  }
}

std::uint64_t add_handle_ref_locked(const std::shared_ptr<PhysicalMemory>& mem) {
  auto& d = driver();
  auto it = d.vmm_handle_of.find(mem.get());
  if (it != d.vmm_handle_of.end() && d.vmm_handles[it->second].weak.lock() == mem) {
    auto& ref = d.vmm_handles[it->second];
    ++ref.refs;
    ref.mem = mem;
    return it->second;
  }
  prune_handles_locked();
  std::uint64_t h = d.next_vmm_handle++;
  d.vmm_handles[h] = {mem, mem, 1};
  d.vmm_handle_of[mem.get()] = h;
  return h;
}

// A handle the caller holds a reference to (refs > 0); else nullptr.
Driver::VmmHandle* find_handle_locked(CUmemGenericAllocationHandle h) {
  auto it = driver().vmm_handles.find(h);
  if (it == driver().vmm_handles.end() || it->second.refs == 0) return nullptr;
  return &it->second;
}

void remember_memory_locked(const std::shared_ptr<PhysicalMemory>& mem) {
  auto& known = driver().known_memory;
  std::erase_if(known, [](const auto& kv) { return kv.second.expired(); });
  known[{mem->key().inode, mem->key().id}] = mem;
}

bool aligned(std::uint64_t v) {
  return v % kGranularity == 0;
}

}  // namespace

EMU_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                  const CUmemAllocationProp* prop,
                                                  CUmemAllocationGranularity_flags option) {
  return api("cuMemGetAllocationGranularity", [&](Call& c) {
    c.arg("option", option);
    EMU_REQUIRE_INIT();
    if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (raw(option) != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        raw(option) != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult r = check_prop(prop); r != CUDA_SUCCESS) return r;
    *granularity = kGranularity;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                const CUmemAllocationProp* prop, unsigned long long flags) {
  return api("cuMemCreate", [&](Call& c) {
    auto t0 = Clock::now();
    c.arg("size", size).arg("flags", flags);
    if (prop != nullptr) {
      c.arg("device", prop->location.id).arg("handle_types", prop->requestedHandleTypes);
    }
    EMU_REQUIRE_INIT();
    if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_prop(prop); r != CUDA_SUCCESS) return r;
    // Windows security attributes only; "required to be zero" otherwise.
    if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
    unsigned types = static_cast<unsigned>(raw(prop->requestedHandleTypes));
    if (types & ~kKnownHandleTypes) return CUDA_ERROR_INVALID_VALUE;
    if (types & ~static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
      return CUDA_ERROR_NOT_SUPPORTED;  // Win32 handles on Linux; fabric needs NVSwitch/IMEX
    }
    if (prop->allocFlags.compressionType != 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (prop->allocFlags.usage != 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (size == 0 || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    auto mem = PhysicalMemory::create(prop->location.id, size, types, PhysicalKind::kVmm);
    if (!mem) return mem.error();
    {
      Lock lock(driver().space_mu);
      remember_memory_locked(*mem);
      *handle = add_handle_ref_locked(*mem);
    }
    c.out("handle", *handle);
    charge_pages(t0, size);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return api("cuMemRelease", [&](Call& c) {
    c.arg("handle", handle);
    EMU_REQUIRE_INIT();
    std::shared_ptr<PhysicalMemory> last;  // destroyed after the lock is dropped
    Lock lock(driver().space_mu);
    auto* h = find_handle_locked(handle);
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (--h->refs == 0) {
      last = std::move(h->mem);  // the value lives on (weakly) while the memory is mapped
      if (last.use_count() == 1) {
        driver().vmm_handle_of.erase(last.get());
        driver().vmm_handles.erase(handle);
      }
    }
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags) {
  return api("cuMemAddressReserve", [&](Call& c) {
    c.arg("size", size).arg("alignment", alignment).ptr("addr", addr).arg("flags", flags);
    EMU_REQUIRE_INIT();
    // "The size and address parameters must be a multiple of the host page size and
    // the alignment must be a power of two or zero for default alignment."
    const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    if (ptr == nullptr || flags != 0 || size == 0 || size % page != 0 || addr % page != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t align = std::max<std::uint64_t>(alignment, kGranularity);
    auto range = reserve_va(size, align, addr);
    if (!range) return CUDA_ERROR_OUT_OF_MEMORY;
    Lock lock(driver().space_mu);
    std::uint64_t va = range->va();
    driver().space.reservations[va].range = std::move(*range);
    *ptr = va;
    c.out_ptr("ptr", va);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return api("cuMemAddressFree", [&](Call& c) {
    c.ptr("ptr", ptr).arg("size", size);
    EMU_REQUIRE_INIT();
    Lock lock(driver().space_mu);
    auto& res = driver().space.reservations;
    auto it = res.find(ptr);
    // Exactly a whole reservation, with nothing mapped in it any more.
    if (it == res.end() || it->second.range.size() != size || !it->second.mappings.empty()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    res.erase(it);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return api("cuMemMap", [&](Call& c) {
    auto t0 = Clock::now();
    c.ptr("ptr", ptr).arg("size", size).arg("offset", offset).arg("handle", handle);
    EMU_REQUIRE_INIT();
    if (flags != 0 || size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    Lock lock(driver().space_mu);
    auto* h = find_handle_locked(handle);
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (offset > h->mem->size() || size > h->mem->size() - offset) return CUDA_ERROR_INVALID_VALUE;
    Reservation* res = driver().space.reservation_of(ptr);
    if (res == nullptr || ptr + size > res->range.va() + res->range.size() || ptr + size < ptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Only VA that nothing is mapped at.
    auto next = res->mappings.lower_bound(ptr);
    if (next != res->mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    if (next != res->mappings.begin()) {
      auto prev = std::prev(next);
      if (prev->second.va + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
    }
    if (!map_fixed(ptr, size, *h->mem, offset, PROT_NONE)) return CUDA_ERROR_OUT_OF_MEMORY;
    res->mappings[ptr] = VmmMapping{
        ptr, size, offset, h->mem,
        std::vector<CUmemAccess_flags>(size / kGranularity, CU_MEM_ACCESS_FLAGS_PROT_NONE)};
    lock.unlock();
    charge_pages(t0, size);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return api("cuMemUnmap", [&](Call& c) {
    c.ptr("ptr", ptr).arg("size", size);
    EMU_REQUIRE_INIT();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::shared_ptr<PhysicalMemory>> dropped;  // freed after unlocking
    Lock lock(driver().space_mu);
    Reservation* res = driver().space.reservation_of(ptr);
    if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The range must consist of whole mappings, back to back: no sub-range, no hole.
    std::uint64_t cur = ptr;
    auto it = res->mappings.find(ptr);
    auto first = it;
    while (cur < ptr + size) {
      if (it == res->mappings.end() || it->first != cur) return CUDA_ERROR_INVALID_VALUE;
      cur += it->second.size;
      ++it;
    }
    if (cur != ptr + size) return CUDA_ERROR_INVALID_VALUE;
    unmap_to_reserved(ptr, size);
    for (auto m = first; m != it; ++m) dropped.push_back(std::move(m->second.mem));
    res->mappings.erase(first, it);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                   size_t count) {
  return api("cuMemSetAccess", [&](Call& c) {
    c.ptr("ptr", ptr).arg("size", size).arg("count", count);
    if (desc != nullptr && count > 0) c.arg("flags", desc[0].flags);
    EMU_REQUIRE_INIT();
    if (desc == nullptr || count == 0 || size == 0 || !aligned(ptr) || !aligned(size)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for (std::size_t i = 0; i < count; ++i) {
      if (raw(desc[i].location.type) != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
      if (!valid_device(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
      int f = raw(desc[i].flags);
      if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      // Device memory is host memory here, so access is one protection for all devices:
      // the most permissive one granted.
      flags = std::max(flags, static_cast<CUmemAccess_flags>(f));
    }
    Lock lock(driver().space_mu);
    Reservation* res = driver().space.reservation_of(ptr);
    if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Every byte of the range must be mapped.
    std::vector<VmmMapping*> touched;
    std::uint64_t cur = ptr;
    while (cur < ptr + size) {
      VmmMapping* m = driver().space.mapping_of(cur);
      if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
      touched.push_back(m);
      cur = m->va + m->size;
    }
    int prot = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                           : PROT_NONE;
    if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
    // With THAW_EMU_PREFAULT the page tables are filled now, as a GPU's are once access is
    // granted, instead of by a host fault per 4 KiB in the first copy (best effort).
    if (driver().cfg().prefault && prot == (PROT_READ | PROT_WRITE)) {
      (void)madvise(reinterpret_cast<void*>(ptr), size, MADV_POPULATE_WRITE);
    }
    // Access is tracked per granule (what check_device consults), so a range that
    // covers part of a mapping changes exactly that part.
    for (VmmMapping* m : touched) {
      std::uint64_t from = std::max<std::uint64_t>(ptr, m->va);
      std::uint64_t to = std::min<std::uint64_t>(ptr + size, m->va + m->size);
      for (std::uint64_t g = from; g < to; g += kGranularity) {
        m->access[(g - m->va) / kGranularity] = flags;
      }
    }
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                   CUdeviceptr ptr) {
  return api("cuMemGetAccess", [&](Call& c) {
    c.ptr("ptr", ptr);
    EMU_REQUIRE_INIT();
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (raw(location->type) != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(location->id)) return CUDA_ERROR_INVALID_DEVICE;
    std::shared_lock lock(driver().space_mu);
    VmmMapping* m = driver().space.mapping_of(ptr);
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *flags = m->access_at(ptr);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return api("cuMemRetainAllocationHandle", [&](Call& c) {
    c.arg("addr", addr);
    EMU_REQUIRE_INIT();
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().space_mu);
    VmmMapping* m = driver().space.mapping_of(reinterpret_cast<std::uint64_t>(addr));
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *handle = add_handle_ref_locked(m->mem);
    c.out("handle", *handle);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                           CUmemGenericAllocationHandle handle) {
  return api("cuMemGetAllocationPropertiesFromHandle", [&](Call& c) {
    c.arg("handle", handle);
    EMU_REQUIRE_INIT();
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(driver().space_mu);
    auto* h = find_handle_locked(handle);
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *prop = CUmemAllocationProp{};
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = h->mem->device();
    prop->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(h->mem->handle_types());
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                 CUmemGenericAllocationHandle handle,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags) {
  return api("cuMemExportToShareableHandle", [&](Call& c) {
    c.arg("handle", handle).arg("type", handleType);
    EMU_REQUIRE_INIT();
    if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (raw(handleType) != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return (raw(handleType) & kKnownHandleTypes) ? CUDA_ERROR_NOT_SUPPORTED
                                                   : CUDA_ERROR_INVALID_VALUE;
    }
    std::shared_lock lock(driver().space_mu);
    auto* h = find_handle_locked(handle);
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Only handle types requested at cuMemCreate can be exported (vLLM's sleep-mode
    // allocations request none and so cannot be shared).
    if (!(h->mem->handle_types() & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = fcntl(h->mem->fd(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareableHandle) = fd;
    c.out("fd", fd);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                   void* osHandle,
                                                   CUmemAllocationHandleType shHandleType) {
  return api("cuMemImportFromShareableHandle", [&](Call& c) {
    // POSIX fds are passed by value, cast to a pointer.
    int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
    c.arg("fd", fd).arg("type", shHandleType);
    EMU_REQUIRE_INIT();
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (raw(shHandleType) != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return (raw(shHandleType) & kKnownHandleTypes) ? CUDA_ERROR_NOT_SUPPORTED
                                                     : CUDA_ERROR_INVALID_VALUE;
    }
    auto imported = PhysicalMemory::import(fd);
    if (!imported) return imported.error();
    if ((*imported)->kind() != PhysicalKind::kVmm) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().space_mu);
    auto key = std::pair{(*imported)->key().inode, (*imported)->key().id};
    std::shared_ptr<PhysicalMemory> mem;
    if (auto it = driver().known_memory.find(key); it != driver().known_memory.end()) {
      mem = it->second.lock();
    }
    if (!mem) {
      mem = *imported;
      remember_memory_locked(mem);
    }
    *handle = add_handle_ref_locked(mem);
    c.out("handle", *handle);
    lock.unlock();
    return CUDA_SUCCESS;
  });
}
