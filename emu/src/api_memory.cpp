// cuMemAlloc device memory, pinned host memory, pointer attributes and legacy CUDA IPC.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>

#include "api_common.hpp"
#include "graph.hpp"

using namespace emu;

namespace {

using SpaceLock = std::unique_lock<std::shared_mutex>;
constexpr std::uint64_t kPage = 4096;

}  // namespace

// cuMemAlloc memory: its own memfd, placed like the driver places it (2 MiB aligned
// when large). Sizes are rounded to whole pages for mapping and accounting.
CUresult emu::legacy_alloc(CUdeviceptr* dptr, std::uint64_t size, Context& ctx, Call& c) {
  std::uint64_t physical = round_up(size, kPage);
  auto mem = PhysicalMemory::create(ctx.device, physical, 0, PhysicalKind::kLegacy);
  if (!mem) return mem.error();
  std::uint64_t align = physical >= kGranularity ? kGranularity : kPage;
  auto range = reserve_va(physical, align);
  if (!range || !map_fixed(range->va(), physical, **mem, 0, PROT_READ | PROT_WRITE)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::uint64_t va = range->va();
  SpaceLock lock(driver().space_mu);
  driver().space.legacy[va] = LegacyAllocation{std::move(*range), size, ctx.handle, *mem};
  *dptr = va;
  c.out_ptr("dptr", va);
  return CUDA_SUCCESS;
}

void emu::legacy_free(CUdeviceptr dptr) {
  std::shared_ptr<PhysicalMemory> mem;  // released after the space lock
  SpaceLock space(driver().space_mu);
  auto it = driver().space.legacy.find(dptr);
  if (it == driver().space.legacy.end()) return;
  mem = std::move(it->second.mem);
  driver().space.legacy.erase(it);
}

namespace {

struct IpcHandlePayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::int32_t device;
  std::uint64_t inode;
  std::uint64_t id;
  std::uint64_t size;
};
static_assert(sizeof(IpcHandlePayload) <= CU_IPC_HANDLE_SIZE);
constexpr std::uint32_t kIpcMagic = 0x54484950;  // "THIP"

}  // namespace

EMU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return api("cuMemAlloc", [&](Call& c) {
    c.arg("size", bytesize);
    EMU_REQUIRE_INIT();
    auto ctx = current_context();
    if (!ctx) return ctx.error();
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    {
      std::lock_guard lock(driver().mu);
      if (CUresult r = check_unsafe_during_capture_locked(); r != CUDA_SUCCESS) return r;
    }
    return legacy_alloc(dptr, bytesize, **ctx, c);
  });
}

EMU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return api("cuMemFree", [&](Call& c) {
    c.ptr("dptr", dptr);
    EMU_REQUIRE_INIT();
    std::unique_lock lock(driver().mu);
    auto cur = current_context_locked();
    if (!cur) return cur.error();
    if (CUresult r = check_unsafe_during_capture_locked(); r != CUDA_SUCCESS) return r;
    std::uint64_t owner = 0;
    {
      std::shared_lock space(driver().space_mu);
      auto it = driver().space.legacy.find(dptr);
      if (it == driver().space.legacy.end()) return CUDA_ERROR_INVALID_VALUE;
      owner = it->second.ctx;
    }
    // Like cudaFree, freeing waits for work already queued that may use the memory.
    std::vector<std::shared_ptr<StreamCore>> streams;
    if (auto ctx = driver().contexts.find(owner)) streams = context_streams_locked(*ctx);
    lock.unlock();
    drain(streams);
    std::shared_ptr<PhysicalMemory> mem;  // released after the space lock
    SpaceLock space(driver().space_mu);
    auto it = driver().space.legacy.find(dptr);
    if (it == driver().space.legacy.end()) return CUDA_ERROR_INVALID_VALUE;
    mem = std::move(it->second.mem);
    driver().space.legacy.erase(it);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return api("cuMemGetInfo", [&](Call& c) {
    EMU_REQUIRE_INIT();
    auto cur = current_context();
    if (!cur) return cur.error();
    int dev = (*cur)->device;
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Device& d = driver().device(dev);
    std::uint64_t used = d.ledger.used();
    *total = d.capacity;
    *free = used >= d.capacity ? 0 : d.capacity - used;
    c.out("free", *free).out("total", *total);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return api("cuMemGetAddressRange", [&](Call& c) {
    c.ptr("dptr", dptr);
    EMU_REQUIRE_INIT();
    if (auto cur = current_context(); !cur) return cur.error();
    std::shared_lock space(driver().space_mu);
    auto info = driver().space.device_info(dptr);
    if (!info) return CUDA_ERROR_NOT_FOUND;
    if (pbase != nullptr) *pbase = info->base;
    if (psize != nullptr) *psize = info->size;
    return CUDA_SUCCESS;
  });
}

// --- pinned host memory ---

static CUresult host_alloc(void** pp, size_t bytesize, unsigned flags, Call& c) {
  c.arg("size", bytesize).arg("flags", flags);
  EMU_REQUIRE_INIT();
  auto cur = current_context();
  if (!cur) return cur.error();
  std::uint64_t ctx = (*cur)->handle;
  constexpr unsigned kValid =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (flags & ~kValid)) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t size = round_up(bytesize, kPage);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto va = reinterpret_cast<std::uint64_t>(p);
  SpaceLock space(driver().space_mu);
  PinnedHost h;
  h.va = va;
  h.size = bytesize;
  h.flags = flags;
  h.ctx = ctx;
  h.owned = MappedRange(va, size);
  driver().space.pinned.emplace(va, std::move(h));
  *pp = p;
  c.out_ptr("ptr", va);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return api("cuMemHostAlloc", [&](Call& c) { return host_alloc(pp, bytesize, Flags, c); });
}

EMU_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return api("cuMemAllocHost", [&](Call& c) { return host_alloc(pp, bytesize, 0, c); });
}

EMU_EXPORT CUresult cuMemFreeHost(void* p) {
  return api("cuMemFreeHost", [&](Call& c) {
    c.arg("ptr", p);
    EMU_REQUIRE_INIT();
    SpaceLock space(driver().space_mu);
    auto& pinned = driver().space.pinned;
    auto it = pinned.find(reinterpret_cast<std::uint64_t>(p));
    if (it == pinned.end() || it->second.registered) return CUDA_ERROR_INVALID_VALUE;
    pinned.erase(it);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return api("cuMemHostRegister", [&](Call& c) {
    c.arg("ptr", p).arg("size", bytesize).arg("flags", Flags);
    EMU_REQUIRE_INIT();
    auto cur = current_context();
    if (!cur) return cur.error();
    std::uint64_t ctx = (*cur)->handle;
    constexpr unsigned kValid = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
    if (p == nullptr || bytesize == 0 || (Flags & ~kValid)) return CUDA_ERROR_INVALID_VALUE;
    if (Flags & CU_MEMHOSTREGISTER_IOMEMORY) return CUDA_ERROR_NOT_SUPPORTED;
    auto va = reinterpret_cast<std::uint64_t>(p);
    // Pinning needs the pages to exist: an unmapped range fails as the driver's does.
    std::uint64_t page_start = va & ~(kPage - 1);
    std::vector<unsigned char> vec((round_up(va + bytesize, kPage) - page_start) / kPage);
    if (mincore(reinterpret_cast<void*>(page_start), round_up(va + bytesize, kPage) - page_start,
                vec.data()) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    SpaceLock space(driver().space_mu);
    auto& pinned = driver().space.pinned;
    auto next = pinned.lower_bound(va);
    if (next != pinned.end() && next->first < va + bytesize) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    if (next != pinned.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size > va) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    PinnedHost h;
    h.va = va;
    h.size = bytesize;
    h.flags = Flags;
    h.registered = true;
    h.ctx = ctx;
    pinned.emplace(va, std::move(h));
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemHostUnregister(void* p) {
  return api("cuMemHostUnregister", [&](Call& c) {
    c.arg("ptr", p);
    EMU_REQUIRE_INIT();
    SpaceLock space(driver().space_mu);
    auto& pinned = driver().space.pinned;
    auto it = pinned.find(reinterpret_cast<std::uint64_t>(p));
    if (it == pinned.end() || !it->second.registered) {
      return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    pinned.erase(it);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  return api("cuMemHostGetDevicePointer", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock space(driver().space_mu);
    if (driver().space.pinned_of(reinterpret_cast<std::uint64_t>(p)) == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the same address
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  return api("cuMemHostGetFlags", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock space(driver().space_mu);
    PinnedHost* h = driver().space.pinned_of(reinterpret_cast<std::uint64_t>(p));
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pFlags = h->flags;
    return CUDA_SUCCESS;
  });
}

// --- pointer attributes ---

namespace {

template <class T>
void put(void* data, T v) {
  std::memcpy(data, &v, sizeof(T));
}

// Writes one attribute for `ptr` (caller holds the space lock shared). `known` is false
// for pointers the driver does not know: then defaults are written.
CUresult write_attribute(int attr, void* data, std::uint64_t ptr, bool* known) {
  auto& space = driver().space;
  auto dev = space.device_info(ptr);
  PinnedHost* host = dev ? nullptr : space.pinned_of(ptr);
  *known = dev || host;
  VmmMapping* vmm = dev && dev->vmm ? space.mapping_of(ptr) : nullptr;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put<CUcontext>(data, to_handle<CUcontext>(dev ? dev->ctx : host ? host->ctx : 0));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put<unsigned>(data, dev ? CU_MEMORYTYPE_DEVICE : host ? CU_MEMORYTYPE_HOST : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      put<CUdeviceptr>(data, *known ? ptr : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      // Device memory has no host mapping a program may use.
      put<void*>(data, host ? reinterpret_cast<void*>(ptr) : nullptr);
      return host || !*known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      put<bool>(data, false);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      put<unsigned long long>(data, dev ? dev->base : host ? host->va : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      put<bool>(data, false);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      put<int>(data, dev ? dev->device : host ? 0 : -2);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      put<bool>(data, dev && !dev->vmm);
      return CUDA_SUCCESS;
    // For VMM memory the range is the reservation, not the mapping (driver docs:
    // "the address of the mappable address range ... from cuMemAddressReserve").
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: {
      Reservation* res = vmm ? space.reservation_of(ptr) : nullptr;
      put<CUdeviceptr>(data, res ? res->range.va() : dev ? dev->base : host ? host->va : 0);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      Reservation* res = vmm ? space.reservation_of(ptr) : nullptr;
      put<size_t>(data, res ? res->range.size() : dev ? dev->size : host ? host->size : 0);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put<bool>(data, *known);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      put<unsigned long long>(data, vmm ? vmm->mem->handle_types() : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      put<bool>(data, dev.has_value());
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
      unsigned flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
      if (vmm) {
        auto a = vmm->access_at(ptr);
        flags = a == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                : a == CU_MEM_ACCESS_FLAGS_PROT_READ    ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                        : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
      } else if (*known) {
        flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      }
      put<unsigned>(data, flags);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      put<CUmemoryPool>(data, nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      put<size_t>(data, vmm ? vmm->size : dev ? dev->size : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      put<void*>(data, reinterpret_cast<void*>(vmm ? vmm->va : dev ? dev->base : 0));
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

EMU_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                          CUdeviceptr ptr) {
  return api("cuPointerGetAttribute", [&](Call& c) {
    c.arg("attribute", attribute).ptr("ptr", ptr);
    EMU_REQUIRE_INIT();
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock space(driver().space_mu);
    bool known = false;
    alignas(16) unsigned char scratch[16];
    CUresult r = write_attribute(raw(attribute), scratch, ptr, &known);
    if (r != CUDA_SUCCESS) return r;
    if (!known) return CUDA_ERROR_INVALID_VALUE;  // "not a valid CUDA pointer"
    return write_attribute(raw(attribute), data, ptr, &known);
  });
}

EMU_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                           CUpointer_attribute* attributes, void** data,
                                           CUdeviceptr ptr) {
  return api("cuPointerGetAttributes", [&](Call& c) {
    c.arg("count", numAttributes).ptr("ptr", ptr);
    EMU_REQUIRE_INIT();
    if (numAttributes == 0 || attributes == nullptr || data == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::shared_lock space(driver().space_mu);
    // Unlike cuPointerGetAttribute, an unknown pointer is not an error: defaults are
    // written (documented behaviour).
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      bool known = false;
      CUresult r = write_attribute(raw(attributes[i]), data[i], ptr, &known);
      if (r != CUDA_SUCCESS && known) return r;
    }
    return CUDA_SUCCESS;
  });
}

// --- legacy CUDA IPC (cuMemAlloc memory only) ---

EMU_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return api("cuIpcGetMemHandle", [&](Call& c) {
    c.ptr("dptr", dptr);
    EMU_REQUIRE_INIT();
    if (auto cur = current_context(); !cur) return cur.error();
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock space(driver().space_mu);
    auto info = driver().space.device_info(dptr);
    // VMM memory is not legacy-IPC capable (share it with cuMemExportToShareableHandle).
    if (!info || info->vmm) return CUDA_ERROR_INVALID_VALUE;
    auto it = driver().space.legacy.find(info->base);
    if (it == driver().space.legacy.end()) return CUDA_ERROR_INVALID_VALUE;  // an IPC mapping
    const PhysicalMemory& mem = *it->second.mem;
    IpcHandlePayload p{kIpcMagic,       getpid(),     mem.fd(),       mem.device(),
                       mem.key().inode, mem.key().id, it->second.size};
    std::memset(pHandle, 0, sizeof(*pHandle));
    std::memcpy(pHandle->reserved, &p, sizeof(p));
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                          unsigned int Flags) {
  return api("cuIpcOpenMemHandle", [&](Call& c) {
    c.arg("flags", Flags);
    EMU_REQUIRE_INIT();
    auto cur = current_context();
    if (!cur) return cur.error();
    std::uint64_t ctx = (*cur)->handle;
    if (pdptr == nullptr || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    IpcHandlePayload p;
    std::memcpy(&p, handle.reserved, sizeof(p));
    if (p.magic != kIpcMagic) return CUDA_ERROR_INVALID_VALUE;
    // A process cannot open its own handle (the driver's rule, not just ours).
    if (p.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
    {
      SpaceLock space(driver().space_mu);
      for (auto& [va, m] : driver().space.ipc) {
        if (m.mem->key() == LedgerKey{p.inode, p.id}) {
          ++m.refs;
          *pdptr = va;
          return CUDA_SUCCESS;
        }
      }
    }
    int fd = open(fmt::format("/proc/{}/fd/{}", p.pid, p.fd).c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter is gone or freed it
    auto mem = PhysicalMemory::import(fd);
    close(fd);
    if (!mem || (*mem)->key() != LedgerKey{p.inode, p.id}) return CUDA_ERROR_INVALID_HANDLE;
    std::uint64_t size = (*mem)->size();
    auto range = reserve_va(size, size >= kGranularity ? kGranularity : kPage);
    if (!range || !map_fixed(range->va(), size, **mem, 0, PROT_READ | PROT_WRITE)) {
      return CUDA_ERROR_MAP_FAILED;
    }
    std::uint64_t va = range->va();
    SpaceLock space(driver().space_mu);
    driver().space.ipc[va] = IpcMapping{std::move(*range), ctx, 1, *mem};
    *pdptr = va;
    c.out_ptr("dptr", va);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return api("cuIpcCloseMemHandle", [&](Call& c) {
    c.ptr("dptr", dptr);
    EMU_REQUIRE_INIT();
    std::shared_ptr<PhysicalMemory> mem;
    SpaceLock space(driver().space_mu);
    auto it = driver().space.ipc.find(dptr);
    if (it == driver().space.ipc.end()) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.refs == 0) {
      mem = std::move(it->second.mem);
      driver().space.ipc.erase(it);
    }
    return CUDA_SUCCESS;
  });
}
