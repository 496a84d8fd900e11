// emu_peer: a second (third, …) process for the multi-process emulator suites.
//
// Started by a test as `emu_peer --sock N`, where N is its end of a SOCK_SEQPACKET
// socket pair. It runs one command per message and answers each with a status line
// (protocol in ../vmm_helpers.hpp). It is deliberately a thin shell over the driver API:
// the tests decide what to do, the peer only does it in another process, so that
// handles, mappings and device-memory accounting really cross a process boundary.
// It exits when told to ("exit") or when the test's end of the socket closes.
//
// Verbs (numbers decimal or 0x-hex; <h> a CUmemGenericAllocationHandle, <p> an address):
//   init                        cuInit, device 0's primary context made current
//   pid                         OK <pid>
//   gran                        OK <minimum granularity of device 0>
//   create <size> <types>       cuMemCreate on device 0 → OK <h>
//   release <h>                 cuMemRelease
//   export <h>                  cuMemExportToShareableHandle(POSIX fd) → OK, fd attached
//   import  (fd attached)       cuMemImportFromShareableHandle → OK <h>; the fd is closed
//   props <h>                   OK <type> <requestedHandleTypes> <location type> <id>
//   reserve <size> [align] [addr]   cuMemAddressReserve → OK <p>
//   addrfree <p> <size>         cuMemAddressFree
//   map <p> <size> <offset> <h> cuMemMap
//   unmap <p> <size>            cuMemUnmap
//   access <p> <size> <flags>   cuMemSetAccess for device 0
//   getaccess <p>               cuMemGetAccess for device 0 → OK <flags>
//   retain <p>                  cuMemRetainAllocationHandle → OK <h>
//   poke <p> <hex>              CPU store of the bytes (the test must know access allows it)
//   peek <p> <len>              CPU load → OK <hex>
//   fillpat <p> <len> <seed>    CPU store of PatternByte(seed, i), i in [0, len)
//   checkpat <p> <len> <seed>   CPU compare → OK, or "BAD mismatch at <i>"
//                               (both through cuMemcpyHtoD/DtoH on a real driver, where the CPU
//                               cannot touch device memory: the conformance program)
//   h2d <p> <hex>               cuMemcpyHtoD of the bytes
//   d2h <p> <len>               cuMemcpyDtoH → OK <hex>
//   memset <p> <byte> <len>     cuMemsetD8
//   alloc <size>                cuMemAlloc → OK <p>
//   free <p>                    cuMemFree
//   ipcget <p>                  cuIpcGetMemHandle → OK <hex of the 64-byte handle>
//   ipcopen <hex>               cuIpcOpenMemHandle(LAZY_ENABLE_PEER_ACCESS) → OK <p>
//   ipcclose <p>                cuIpcCloseMemHandle
//   meminfo                     cuMemGetInfo → OK <free> <total>
//   stats                       (the emulator only) OK <device_bytes_in_use> <process_bytes_in_use>
//                                  <physical_allocations> <vmm_handle_refs> <vmm_mappings>
//                                  <legacy_allocations> <ipc_mappings> <reservations>
//                                  <reserved_bytes>
//   exit                        OK, then the process exits with status 0
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <unistd.h>

#include "../vmm_helpers.hpp"
#include "thaw/emu_inspect.h"

namespace {

using thaw_vmm_test::FillPattern;
using thaw_vmm_test::FirstPatternMismatch;
using thaw_vmm_test::FromHex;
using thaw_vmm_test::ParseU64;
using thaw_vmm_test::ToHex;

struct Reply {
  std::string line;
  int fd = -1;  // sent with the reply, then closed here
};

Reply Ok(const std::string& values = {}) {
  return {values.empty() ? "OK" : "OK " + values};
}
Reply Bad(const std::string& why) {
  return {"BAD " + why};
}
Reply Err(CUresult r) {
  return {"ERR " + std::to_string(static_cast<int>(r)) + " " + thaw_vmm_test::CuName(r)};
}

std::string U(uint64_t v) {
  return std::to_string(v);
}

class Peer {
 public:
  // Runs one request. `fd` is the received descriptor (or -1); the peer owns it.
  Reply Run(const std::vector<std::string>& w, int fd, bool* quit) {
    if (w.empty()) return Bad("empty command");
    const std::string& verb = w[0];
    std::vector<uint64_t> n;  // numeric arguments, where the verb takes numbers
    auto nums = [&](size_t min_count, size_t max_count) {
      if (w.size() - 1 < min_count || w.size() - 1 > max_count) return false;
      n.clear();
      for (size_t i = 1; i < w.size(); ++i) {
        uint64_t v;
        if (!ParseU64(w[i], &v)) return false;
        n.push_back(v);
      }
      return true;
    };
    auto dptr = [](uint64_t v) { return static_cast<CUdeviceptr>(v); };
    auto host = [](uint64_t v) { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(v)); };

    if (verb == "exit") {
      *quit = true;
      return Ok();
    }
    if (verb == "pid") return Ok(U(static_cast<uint64_t>(getpid())));
    if (verb == "init") {
      if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return Err(r);
      if (CUresult r = cuDeviceGet(&dev_, 0); r != CUDA_SUCCESS) return Err(r);
      if (ctx_ == nullptr) {
        if (CUresult r = cuDevicePrimaryCtxRetain(&ctx_, dev_); r != CUDA_SUCCESS) return Err(r);
      }
      if (CUresult r = cuCtxSetCurrent(ctx_); r != CUDA_SUCCESS) return Err(r);
      return Ok();
    }
    if (verb == "gran") {
      CUmemAllocationProp prop = thaw_vmm_test::DeviceProp(0);
      size_t g = 0;
      CUresult r = cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      return r == CUDA_SUCCESS ? Ok(U(g)) : Err(r);
    }
    if (verb == "create") {
      if (!nums(2, 2)) return Bad("usage: create <size> <types>");
      CUmemAllocationProp prop =
          thaw_vmm_test::DeviceProp(0, static_cast<CUmemAllocationHandleType>(n[1]));
      CUmemGenericAllocationHandle h = 0;
      CUresult r = cuMemCreate(&h, n[0], &prop, 0);
      return r == CUDA_SUCCESS ? Ok(U(h)) : Err(r);
    }
    if (verb == "release") {
      if (!nums(1, 1)) return Bad("usage: release <h>");
      CUresult r = cuMemRelease(n[0]);
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "export") {
      if (!nums(1, 1)) return Bad("usage: export <h>");
      int out = -1;
      CUresult r =
          cuMemExportToShareableHandle(&out, n[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (r != CUDA_SUCCESS) return Err(r);
      Reply reply = Ok();
      reply.fd = out;
      return reply;
    }
    if (verb == "import") {
      if (fd < 0) return Bad("import needs a descriptor");
      CUmemGenericAllocationHandle h = 0;
      CUresult r = cuMemImportFromShareableHandle(&h, thaw_vmm_test::AsOsHandle(fd),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      return r == CUDA_SUCCESS ? Ok(U(h)) : Err(r);
    }
    if (verb == "props") {
      if (!nums(1, 1)) return Bad("usage: props <h>");
      CUmemAllocationProp prop{};
      CUresult r = cuMemGetAllocationPropertiesFromHandle(&prop, n[0]);
      if (r != CUDA_SUCCESS) return Err(r);
      return Ok(U(prop.type) + " " + U(prop.requestedHandleTypes) + " " + U(prop.location.type) +
                " " + U(static_cast<uint64_t>(prop.location.id)));
    }
    if (verb == "reserve") {
      if (!nums(1, 3)) return Bad("usage: reserve <size> [align] [addr]");
      CUdeviceptr p = 0;
      CUresult r =
          cuMemAddressReserve(&p, n[0], n.size() > 1 ? n[1] : 0, n.size() > 2 ? dptr(n[2]) : 0, 0);
      return r == CUDA_SUCCESS ? Ok(U(p)) : Err(r);
    }
    if (verb == "addrfree") {
      if (!nums(2, 2)) return Bad("usage: addrfree <p> <size>");
      CUresult r = cuMemAddressFree(dptr(n[0]), n[1]);
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "map") {
      if (!nums(4, 4)) return Bad("usage: map <p> <size> <offset> <h>");
      CUresult r = cuMemMap(dptr(n[0]), n[1], n[2], n[3], 0);
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "unmap") {
      if (!nums(2, 2)) return Bad("usage: unmap <p> <size>");
      CUresult r = cuMemUnmap(dptr(n[0]), n[1]);
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "access") {
      if (!nums(3, 3)) return Bad("usage: access <p> <size> <flags>");
      CUmemAccessDesc desc = thaw_vmm_test::AccessDesc(static_cast<CUmemAccess_flags>(n[2]), 0);
      CUresult r = cuMemSetAccess(dptr(n[0]), n[1], &desc, 1);
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "getaccess") {
      if (!nums(1, 1)) return Bad("usage: getaccess <p>");
      CUmemLocation loc = thaw_vmm_test::DeviceLocation(0);
      unsigned long long flags = 0;
      CUresult r = cuMemGetAccess(&flags, &loc, dptr(n[0]));
      return r == CUDA_SUCCESS ? Ok(U(flags)) : Err(r);
    }
    if (verb == "retain") {
      if (!nums(1, 1)) return Bad("usage: retain <p>");
      CUmemGenericAllocationHandle h = 0;
      CUresult r = cuMemRetainAllocationHandle(&h, host(n[0]));
      return r == CUDA_SUCCESS ? Ok(U(h)) : Err(r);
    }
    if (verb == "poke" || verb == "h2d") {
      uint64_t p;
      std::vector<uint8_t> bytes;
      if (w.size() != 3 || !ParseU64(w[1], &p) || !FromHex(w[2], &bytes)) {
        return Bad("usage: " + verb + " <p> <hex>");
      }
      if (verb == "poke") {
        std::memcpy(host(p), bytes.data(), bytes.size());
        return Ok();
      }
      CUresult r = cuMemcpyHtoD(dptr(p), bytes.data(), bytes.size());
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "peek" || verb == "d2h") {
      if (!nums(2, 2)) return Bad("usage: " + verb + " <p> <len>");
      if (n[1] * 2 + 16 > thaw_vmm_test::kMaxMessage) return Bad("too long");
      std::vector<uint8_t> bytes(n[1]);
      if (verb == "peek") {
        std::memcpy(bytes.data(), host(n[0]), bytes.size());
      } else if (CUresult r = cuMemcpyDtoH(bytes.data(), dptr(n[0]), bytes.size());
                 r != CUDA_SUCCESS) {
        return Err(r);
      }
      return Ok(ToHex(bytes.data(), bytes.size()));
    }
    if (verb == "fillpat") {
      if (!nums(3, 3)) return Bad("usage: fillpat <p> <len> <seed>");
      if (thaw::test::on_emulator()) {
        FillPattern(host(n[0]), n[1], n[2]);
        return Ok();
      }
      std::vector<uint8_t> bytes(n[1]);
      FillPattern(bytes.data(), bytes.size(), n[2]);
      CUresult r = cuMemcpyHtoD(dptr(n[0]), bytes.data(), bytes.size());
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "checkpat") {
      if (!nums(3, 3)) return Bad("usage: checkpat <p> <len> <seed>");
      long long at = -1;
      if (thaw::test::on_emulator()) {
        at = FirstPatternMismatch(host(n[0]), n[1], n[2]);
      } else {
        std::vector<uint8_t> bytes(n[1]);
        if (CUresult r = cuMemcpyDtoH(bytes.data(), dptr(n[0]), bytes.size()); r != CUDA_SUCCESS) {
          return Err(r);
        }
        at = FirstPatternMismatch(bytes.data(), bytes.size(), n[2]);
      }
      return at < 0 ? Ok() : Bad("mismatch at " + std::to_string(at));
    }
    if (verb == "memset") {
      if (!nums(3, 3)) return Bad("usage: memset <p> <byte> <len>");
      CUresult r = cuMemsetD8(dptr(n[0]), static_cast<unsigned char>(n[1]), n[2]);
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "alloc") {
      if (!nums(1, 1)) return Bad("usage: alloc <size>");
      CUdeviceptr p = 0;
      CUresult r = cuMemAlloc(&p, n[0]);
      return r == CUDA_SUCCESS ? Ok(U(p)) : Err(r);
    }
    if (verb == "free") {
      if (!nums(1, 1)) return Bad("usage: free <p>");
      CUresult r = cuMemFree(dptr(n[0]));
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "ipcget") {
      if (!nums(1, 1)) return Bad("usage: ipcget <p>");
      CUipcMemHandle h{};
      CUresult r = cuIpcGetMemHandle(&h, dptr(n[0]));
      return r == CUDA_SUCCESS ? Ok(ToHex(&h, sizeof h)) : Err(r);
    }
    if (verb == "ipcopen") {
      std::vector<uint8_t> bytes;
      CUipcMemHandle h{};
      if (w.size() != 2 || !FromHex(w[1], &bytes) || bytes.size() != sizeof h) {
        return Bad("usage: ipcopen <hex of CUipcMemHandle>");
      }
      std::memcpy(&h, bytes.data(), sizeof h);
      CUdeviceptr p = 0;
      CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      return r == CUDA_SUCCESS ? Ok(U(p)) : Err(r);
    }
    if (verb == "ipcclose") {
      if (!nums(1, 1)) return Bad("usage: ipcclose <p>");
      CUresult r = cuIpcCloseMemHandle(dptr(n[0]));
      return r == CUDA_SUCCESS ? Ok() : Err(r);
    }
    if (verb == "meminfo") {
      size_t free = 0, total = 0;
      CUresult r = cuMemGetInfo(&free, &total);
      return r == CUDA_SUCCESS ? Ok(U(free) + " " + U(total)) : Err(r);
    }
    if (verb == "stats") {
      // Looked up, not linked: the peer also runs against a real driver, which lacks them.
      using DeviceStatsFn = int (*)(int, ThawEmuDeviceStats*);
      using ProcessStatsFn = int (*)(ThawEmuProcessStats*);
      void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
      auto device_stats = reinterpret_cast<DeviceStatsFn>(
          libcuda != nullptr ? dlsym(libcuda, "thawEmuGetDeviceStats") : nullptr);
      auto process_stats = reinterpret_cast<ProcessStatsFn>(
          libcuda != nullptr ? dlsym(libcuda, "thawEmuGetProcessStats") : nullptr);
      if (libcuda != nullptr) dlclose(libcuda);  // still loaded: it is this program's libcuda
      if (device_stats == nullptr || process_stats == nullptr) return Err(CUDA_ERROR_NOT_SUPPORTED);
      ThawEmuDeviceStats d{};
      ThawEmuProcessStats p{};
      if (int r = device_stats(0, &d); r != 0) return Err(static_cast<CUresult>(r));
      if (int r = process_stats(&p); r != 0) return Err(static_cast<CUresult>(r));
      return Ok(U(d.device_bytes_in_use) + " " + U(d.process_bytes_in_use) + " " +
                U(d.physical_allocations) + " " + U(d.vmm_handle_refs) + " " + U(d.vmm_mappings) +
                " " + U(d.legacy_allocations) + " " + U(d.ipc_mappings) + " " + U(p.reservations) +
                " " + U(p.reserved_bytes));
    }
    return Bad("unknown verb '" + verb + "'");
  }

 private:
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  int sock = -1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--sock") == 0) sock = std::atoi(argv[i + 1]);
  }
  if (sock < 0) {
    std::fprintf(stderr, "usage: %s --sock <fd>\n", argv[0]);
    return 2;
  }
  Peer peer;
  while (true) {
    std::string text;
    int fd = -1;
    auto st = thaw_vmm_test::ReceiveMessage(sock, &text, &fd, -1);
    if (st != thaw_vmm_test::RecvStatus::kOk) break;  // the test went away
    bool quit = false;
    Reply reply = peer.Run(thaw_vmm_test::SplitWords(text), fd, &quit);
    if (fd >= 0) close(fd);  // an import does not take ownership of the descriptor
    bool sent = thaw_vmm_test::SendMessage(sock, reply.line, reply.fd);
    if (reply.fd >= 0) close(reply.fd);
    if (!sent || quit) break;
  }
  close(sock);
  return 0;
}
