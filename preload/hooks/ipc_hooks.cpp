// CUDA IPC of deterministic-layout memory. The layout's memory is VMM memory, which the
// driver's legacy IPC refuses (cuIpcGetMemHandle answers INVALID_VALUE) — yet engines share
// buffers between processes with exactly that call (vLLM's custom all-reduce). So for the
// layout's allocations the shim translates legacy IPC into POSIX-fd VMM sharing:
//
//   cuIpcGetMemHandle: export the allocation's physical handle as a descriptor
//     (cuMemRetainAllocationHandle + cuMemExportToShareableHandle) and hand it to thawd,
//     which answers a token; the 64-byte handle carries the token (a descriptor cannot
//     travel inside bytes that engines pass around as plain data). Without thawd, the
//     handle carries the exporter's pid and descriptor number instead, and the importer
//     takes the descriptor with pidfd_getfd (needs ptrace rights over the exporter).
//   cuIpcOpenMemHandle: get the descriptor back, import it, reserve VA, map, set access;
//     the same handle opened twice gives the same address (as the driver does).
//   cuIpcCloseMemHandle: unmap and free the VA at the last close.
//
// Handles of other memory, and pointers outside the layout, go to the driver untouched.
#include <cuda.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "preload/interpose/hook_table.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"
#include "preload/thawd_client/thawd_client.hpp"

using namespace thaw::preload;

namespace {

constexpr char kMagic[8] = {'T', 'H', 'A', 'W', 'I', 'P', 'C', '1'};
enum class Carrier : std::int32_t { thawd = 1, pidfd = 2 };

// What a translated handle's 64 bytes hold.
struct ThawIpcHandle {
  char magic[8];
  std::uint64_t token;  // thawd's (Carrier::thawd)
  std::uint64_t size;   // the allocation's size as requested
  std::uint64_t mapped;
  std::int32_t pid;  // the exporter
  std::int32_t fd;   // the exporter's descriptor (Carrier::pidfd)
  Carrier carrier;
};
static_assert(sizeof(ThawIpcHandle) <= sizeof(CUipcMemHandle::reserved));

template <typename Fn>
Fn sym(const char* name) {
  return reinterpret_cast<Fn>(driver_symbol(name));
}

std::uint64_t key_of(const ThawIpcHandle& h) {
  return h.carrier == Carrier::thawd
             ? h.token
             : (std::uint64_t(std::uint32_t(h.pid)) << 32) | std::uint32_t(h.fd);
}

CUresult export_allocation(const LayoutAllocation& a, CUipcMemHandle* out) {
  auto retain =
      sym<CUresult (*)(CUmemGenericAllocationHandle*, void*)>("cuMemRetainAllocationHandle");
  auto export_fd = sym<CUresult (*)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                    unsigned long long)>("cuMemExportToShareableHandle");
  auto release = sym<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  if (retain == nullptr || export_fd == nullptr || release == nullptr)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = retain(&handle, reinterpret_cast<void*>(a.base)); r != CUDA_SUCCESS) return r;
  int fd = -1;
  CUresult r = export_fd(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)release(handle);
  if (r != CUDA_SUCCESS) return r;
  ThawIpcHandle h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.size = a.size;
  h.mapped = a.mapped;
  h.pid = ::getpid();
  if (auto token = daemon_export_ipc(fd, a.mapped)) {
    h.carrier = Carrier::thawd;
    h.token = *token;
    ::close(fd);
  } else {
    notice_once("ipc-pidfd",
                "CUDA IPC of deterministic-layout memory without thawd: the handle carries this "
                "process's descriptor, which the opener takes with pidfd_getfd (it needs ptrace "
                "rights over this process)");
    h.carrier = Carrier::pidfd;
    h.fd = fd;  // kept open for the importers until this process exits
  }
  std::memset(out, 0, sizeof *out);
  std::memcpy(out->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

// The exported memory's descriptor in this process, or -1.
int descriptor_of(const ThawIpcHandle& h) {
  if (h.carrier == Carrier::thawd) {
    // The export must be the size the handle names, or the token names other memory.
    auto fd = daemon_import_ipc(h.token, h.mapped);
    return fd ? fd->release() : -1;
  }
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, h.pid, 0));
  if (pidfd < 0) return -1;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, h.fd, 0));
  ::close(pidfd);
  return fd;
}

CUresult map_imported(const ThawIpcHandle& h, int fd, CUdeviceptr* out) {
  auto get_device = sym<CUresult (*)(CUdevice*)>("cuCtxGetDevice");
  auto import = sym<CUresult (*)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType)>(
      "cuMemImportFromShareableHandle");
  auto reserve = sym<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
      "cuMemAddressReserve");
  auto address_free = sym<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  auto map = sym<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                              unsigned long long)>("cuMemMap");
  auto unmap = sym<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto release = sym<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  auto set_access =
      sym<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>("cuMemSetAccess");
  if (!get_device || !import || !reserve || !address_free || !map || !unmap || !release ||
      !set_access)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUdevice device = 0;
  if (CUresult r = get_device(&device); r != CUDA_SUCCESS) return r;
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = import(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS)
    return r;
  CUdeviceptr va = 0;
  CUresult r = reserve(&va, h.mapped, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    r = map(va, h.mapped, 0, handle, 0);
    if (r != CUDA_SUCCESS) (void)address_free(va, h.mapped);
  }
  (void)release(handle);  // the mapping keeps the memory
  if (r != CUDA_SUCCESS) return r;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (r = set_access(va, h.mapped, &access, 1); r != CUDA_SUCCESS) {
    (void)unmap(va, h.mapped);
    (void)address_free(va, h.mapped);
    return r;
  }
  *out = va;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  auto driver_fn = real<decltype(&cuIpcGetMemHandle)>(Hook::ipc_get_mem_handle);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside() || handle == nullptr) return driver_fn(handle, dptr);
  ReentryGuard guard;
  DeterministicLayout* layout = runtime().layout();
  if (layout == nullptr || !layout->in_region(dptr)) return driver_fn(handle, dptr);
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  auto a = layout->find(dptr);
  if (!a) return CUDA_ERROR_INVALID_VALUE;  // freed: what the driver says of freed memory
  // VMM memory the caller mapped into its own reservation: the driver refuses legacy IPC of
  // it, with or without the shim.
  if (a->reservation) return driver_fn(handle, dptr);
  IpcTables& s = runtime().ipc();
  std::lock_guard lock(s.mutex);
  if (auto it = s.exported.find(a->base); it != s.exported.end()) {
    *handle = it->second;
    return CUDA_SUCCESS;
  }
  if (CUresult r = export_allocation(*a, handle); r != CUDA_SUCCESS) return r;
  s.exported[a->base] = *handle;
  debug("cuIpcGetMemHandle({:#x}) exported {} bytes as POSIX-fd VMM", dptr, a->mapped);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  auto driver_fn = real<decltype(&cuIpcOpenMemHandle_v2)>(Hook::ipc_open_mem_handle);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  ThawIpcHandle h;
  std::memcpy(&h, handle.reserved, sizeof h);
  if (ReentryGuard::inside() || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    return driver_fn(pdptr, handle, flags);
  }
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  // The driver's rules for legacy IPC, kept.
  if (pdptr == nullptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (h.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  IpcTables& s = runtime().ipc();
  std::lock_guard lock(s.mutex);
  const std::uint64_t key = key_of(h);
  for (auto& [va, o] : s.opened) {
    if (o.key == key) {
      ++o.refs;
      *pdptr = va;
      return CUDA_SUCCESS;
    }
  }
  const int fd = descriptor_of(h);
  if (fd < 0) {
    notice_once("ipc-open-failed",
                "a CUDA IPC handle of thaw's could not be opened: its exporter has exited, or "
                "thawd does not know it");
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUdeviceptr va = 0;
  const CUresult r = map_imported(h, fd, &va);
  ::close(fd);
  if (r != CUDA_SUCCESS) return r;
  s.opened[va] = IpcOpened{key, h.mapped, 1};
  *pdptr = va;
  debug("cuIpcOpenMemHandle: {} bytes of pid {} at {:#x}", h.mapped, h.pid, va);
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  auto driver_fn = real<decltype(&cuIpcCloseMemHandle)>(Hook::ipc_close_mem_handle);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside()) return driver_fn(dptr);
  ReentryGuard guard;
  IpcTables& s = runtime().ipc();
  std::unique_lock lock(s.mutex);
  auto it = s.opened.find(dptr);
  if (it == s.opened.end()) {
    lock.unlock();
    return driver_fn(dptr);
  }
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  const std::uint64_t mapped = it->second.mapped;
  s.opened.erase(it);
  auto unmap = sym<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto address_free = sym<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  if (unmap == nullptr || address_free == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (CUresult r = unmap(dptr, mapped); r != CUDA_SUCCESS) return r;
  return address_free(dptr, mapped);
}

}  // extern "C"
