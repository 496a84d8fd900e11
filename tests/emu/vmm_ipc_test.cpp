// Multi-process behaviour of the emulated driver: VMM handles exported as POSIX file
// descriptors and passed over a Unix socket (SCM_RIGHTS), device memory shared by every
// process on the device, release of a dead process's memory, and legacy CUDA IPC.
//
// The other process is emu_peer (tests/emu/peer/emu_peer.cpp), spawned with posix_spawn
// and driven one command at a time (protocol in vmm_helpers.hpp). It inherits
// THAW_EMU_STATE_DIR, so it uses the same emulated GPU as the test.
#include <gtest/gtest.h>

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "thaw/emu_inspect.h"
#include "vmm_helpers.hpp"

namespace thaw_vmm_test {
namespace {

// The peer's view of the device and of itself ("stats" verb).
struct PeerStats {
  uint64_t device_bytes = 0, process_bytes = 0, physical_allocations = 0, handle_refs = 0,
           mappings = 0, legacy_allocations = 0, ipc_mappings = 0, reservations = 0,
           reserved_bytes = 0;
};

class VmmIpc : public VmmFixture {
 protected:
  // Spawns a peer and initialises the driver in it.
  void StartPeer(EmuPeer& peer) {
    std::string error;
    ASSERT_TRUE(peer.Start(&error)) << error;
    PeerReply r = peer.Call("init");
    ASSERT_TRUE(r.ok) << r.line;
  }

  static PeerReply Must(EmuPeer& peer, const std::string& command, int fd = -1) {
    PeerReply r = peer.Call(command, fd);
    EXPECT_TRUE(r.ok) << command << " → " << r.line;
    return r;
  }

  // The peer's emulator counters; zeros on a real driver, where checks of them are left out.
  static PeerStats Stats(EmuPeer& peer) {
    PeerStats s;
    if (!::thaw::test::on_emulator()) return s;
    PeerReply r = Must(peer, "stats");
    EXPECT_EQ(r.values.size(), 9u) << r.line;
    s.device_bytes = r.U64(0);
    s.process_bytes = r.U64(1);
    s.physical_allocations = r.U64(2);
    s.handle_refs = r.U64(3);
    s.mappings = r.U64(4);
    s.legacy_allocations = r.U64(5);
    s.ipc_mappings = r.U64(6);
    s.reservations = r.U64(7);
    s.reserved_bytes = r.U64(8);
    return s;
  }

  int Export(CUmemGenericAllocationHandle h) {
    int fd = -1;
    EXPECT_CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    return fd;
  }

  // Waits up to 5 s for the device-wide bytes in use to reach `expected` (a dead
  // process's memory is returned when the emulator notices the death).
  unsigned long long WaitForDeviceBytes(unsigned long long expected) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    unsigned long long now = DevStats().device_bytes_in_use;
    while (now != expected && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      now = DevStats().device_bytes_in_use;
    }
    return now;
  }

  // Waits up to 5 s for the free memory to reach `expected` (a dead process's memory is
  // returned once the driver notices the death).
  size_t WaitForFreeMemory(size_t expected) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    size_t now = FreeMemory();
    while (now != expected && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      now = FreeMemory();
    }
    return now;
  }
};

using VmmIpcLegacy = VmmIpc;

// The acceptance test: A exports a cuMemCreate handle over a Unix socket; B imports,
// maps, writes; A reads the bytes back.
TEST_F(VmmIpc, PeerWritesThroughAnImportedHandleAndTheExporterReadsTheBytes) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  constexpr size_t kSize = 4 * kGranularity;
  constexpr uint64_t kSeed = 0xacce97;
  CUmemGenericAllocationHandle h = Create(kSize, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = Export(h);
  ASSERT_GE(fd, 0);

  PeerReply imported = peer.Call("import", fd);
  close(fd);
  ASSERT_TRUE(imported.ok) << imported.line;
  uint64_t hb = imported.U64(0);
  PeerReply reserved = Must(peer, Cmd("reserve", kSize));
  uint64_t vb = reserved.U64(0);
  ASSERT_TRUE(Must(peer, Cmd("map", vb, kSize, 0, hb)).ok);
  ASSERT_TRUE(Must(peer, Cmd("access", vb, kSize, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)).ok);
  ASSERT_TRUE(Must(peer, Cmd("fillpat", vb, kSize, kSeed)).ok);
  ASSERT_TRUE(Must(peer, Cmd("unmap", vb, kSize)).ok);
  ASSERT_TRUE(Must(peer, Cmd("addrfree", vb, kSize)).ok);
  ASSERT_TRUE(Must(peer, Cmd("release", hb)).ok);
  PeerStats ps = Stats(peer);
  THAW_EMU_CHECK(EXPECT_EQ(ps.handle_refs, 0u));
  THAW_EMU_CHECK(EXPECT_EQ(ps.mappings, 0u));
  THAW_EMU_CHECK(EXPECT_EQ(ps.process_bytes, 0u));

  CUdeviceptr va = Reserve(kSize);
  ASSERT_CU_OK(cuMemMap(va, kSize, 0, h, 0));
  SetAccess(va, kSize);
  EXPECT_EQ(CheckPattern(va, kSize, kSeed), -1) << "bytes written by the peer";
  std::vector<uint8_t> copy(4096);
  ASSERT_CU_OK(cuMemcpyDtoH(copy.data(), va + kSize - copy.size(), copy.size()));
  EXPECT_EQ(FirstPatternMismatch(copy.data(), copy.size(), kSeed, kSize - copy.size()), -1)
      << "the driver's copy sees them too";
  EXPECT_CU_OK(cuMemUnmap(va, kSize));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, kSize));
}

// Both processes map the same memory at once: a store by one is visible to the other.
TEST_F(VmmIpc, ConcurrentMappingsInTwoProcessesShareBytes) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  Mapped m = CreateMapped(2 * kGranularity, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = Export(m.handle);
  PeerReply imported = peer.Call("import", fd);
  close(fd);
  ASSERT_TRUE(imported.ok) << imported.line;
  uint64_t hb = imported.U64(0);
  uint64_t vb = Must(peer, Cmd("reserve", m.size)).U64(0);
  ASSERT_TRUE(Must(peer, Cmd("map", vb, m.size, 0, hb)).ok);
  ASSERT_TRUE(Must(peer, Cmd("access", vb, m.size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)).ok);

  WritePattern(m.va, 256, 1);
  EXPECT_TRUE(Must(peer, Cmd("checkpat", vb, 256, 1)).ok) << "the peer sees the test's store";
  ASSERT_TRUE(Must(peer, Cmd("fillpat", vb + kGranularity, 256, 2)).ok);
  EXPECT_EQ(CheckPattern(m.va + kGranularity, 256, 2), -1) << "the test sees the peer's store";
  PeerReply peek = Must(peer, Cmd("d2h", vb, 16));
  std::vector<uint8_t> stored(16);
  FillPattern(stored.data(), stored.size(), 1);
  EXPECT_EQ(peek.values.size() == 1 ? peek.values[0] : "", ToHex(stored.data(), stored.size()))
      << "the peer's driver copy reads the same bytes";

  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), m.size) << "one allocation, counted once on the device");
  ASSERT_TRUE(Must(peer, Cmd("unmap", vb, m.size)).ok);
  ASSERT_TRUE(Must(peer, Cmd("addrfree", vb, m.size)).ok);
  ASSERT_TRUE(Must(peer, Cmd("release", hb)).ok);
  Destroy(m);
}

// The reverse direction: the peer creates and exports, the descriptor comes back with the
// reply, the test imports and reads what the peer wrote.
TEST_F(VmmIpc, PeerExportsAndTheTestImports) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  constexpr size_t kSize = 2 * kGranularity;
  uint64_t hb = Must(peer, Cmd("create", kSize, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)).U64(0);
  uint64_t vb = Must(peer, Cmd("reserve", kSize)).U64(0);
  ASSERT_TRUE(Must(peer, Cmd("map", vb, kSize, 0, hb)).ok);
  ASSERT_TRUE(Must(peer, Cmd("access", vb, kSize, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)).ok);
  ASSERT_TRUE(Must(peer, Cmd("fillpat", vb, kSize, 77)).ok);
  PeerReply exported = Must(peer, Cmd("export", hb));
  ASSERT_GE(exported.fd, 0) << "the reply carries the descriptor";

  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU_OK(cuMemImportFromShareableHandle(&h, AsOsHandle(exported.fd),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(exported.fd);
  CUdeviceptr va = Reserve(kSize);
  ASSERT_CU_OK(cuMemMap(va, kSize, 0, h, 0));
  SetAccess(va, kSize, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_EQ(CheckPattern(va, kSize, 77), -1);
  ThawEmuDeviceStats mine = DevStats();
  THAW_EMU_CHECK(EXPECT_EQ(mine.process_bytes_in_use - baseline_.process_bytes_in_use, kSize));
  THAW_EMU_CHECK(EXPECT_EQ(mine.device_bytes_in_use - baseline_.device_bytes_in_use, kSize));

  ASSERT_TRUE(Must(peer, Cmd("unmap", vb, kSize)).ok);
  ASSERT_TRUE(Must(peer, Cmd("addrfree", vb, kSize)).ok);
  ASSERT_TRUE(Must(peer, Cmd("release", hb)).ok);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), kSize) << "the test's import keeps the memory");
  EXPECT_EQ(CheckPattern(va, kSize, 77), -1);
  EXPECT_CU_OK(cuMemUnmap(va, kSize));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, kSize));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// An emulated GPU is one device shared by every process: a peer's allocations lower the
// free memory the test sees, and a process killed while holding memory gives it back.
TEST_F(VmmIpc, PeerAllocationsLowerFreeMemoryAndAKilledPeerGivesThemBack) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  size_t free0 = FreeMemory();
  unsigned long long bytes0 = DevStats().device_bytes_in_use;

  uint64_t h1 = Must(peer, Cmd("create", 6 * kGranularity, 0)).U64(0);
  uint64_t h2 = Must(peer, Cmd("create", 2 * kGranularity, 0)).U64(0);
  EXPECT_EQ(free0 - FreeMemory(), 8 * kGranularity);
  // One allocation mapped, its handle released: held only through the mapping.
  uint64_t vb = Must(peer, Cmd("reserve", 2 * kGranularity)).U64(0);
  ASSERT_TRUE(Must(peer, Cmd("map", vb, 2 * kGranularity, 0, h2)).ok);
  ASSERT_TRUE(Must(peer, Cmd("release", h2)).ok);
  EXPECT_NE(h1, 0u);
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().device_bytes_in_use - bytes0, 8 * kGranularity));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().process_bytes_in_use, baseline_.process_bytes_in_use)
                 << "none of it is the test's");

  int status = peer.Kill();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  THAW_EMU_CHECK(EXPECT_EQ(WaitForDeviceBytes(bytes0), bytes0)
                 << "a dead process's memory is released");
  EXPECT_EQ(WaitForFreeMemory(free0), free0) << "a dead process's memory is released";
}

// "The memory allocation will be freed when all outstanding mappings to the memory are
// unmapped and when all outstanding references to the handle (including it's shareable
// counterparts) are also released." An importer's reference keeps the memory counted
// after the exporter released everything, until the importer releases too.
TEST_F(VmmIpc, ImportersReferenceKeepsMemoryAfterTheExporterReleased) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  constexpr size_t kSize = 3 * kGranularity;
  Mapped m = CreateMapped(kSize, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  WritePattern(m.va, kSize, 99);
  int fd = Export(m.handle);
  PeerReply imported = peer.Call("import", fd);
  close(fd);
  ASSERT_TRUE(imported.ok) << imported.line;
  uint64_t hb = imported.U64(0);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), kSize) << "an import is not a second allocation");
  PeerStats ps = Stats(peer);
  THAW_EMU_CHECK(EXPECT_EQ(ps.process_bytes, kSize));
  THAW_EMU_CHECK(EXPECT_EQ(ps.physical_allocations, 1u));
  THAW_EMU_CHECK(EXPECT_EQ(ps.handle_refs, 1u));

  Destroy(m);
  ThawEmuDeviceStats mine = DevStats();
  THAW_EMU_CHECK(EXPECT_EQ(mine.device_bytes_in_use - baseline_.device_bytes_in_use, kSize)
                 << "still held by the peer");
  THAW_EMU_CHECK(EXPECT_EQ(mine.process_bytes_in_use, baseline_.process_bytes_in_use));
  THAW_EMU_CHECK(EXPECT_EQ(mine.physical_allocations, baseline_.physical_allocations));

  // The memory is still whole: the peer maps it and finds the test's bytes.
  uint64_t vb = Must(peer, Cmd("reserve", kSize)).U64(0);
  ASSERT_TRUE(Must(peer, Cmd("map", vb, kSize, 0, hb)).ok);
  ASSERT_TRUE(Must(peer, Cmd("access", vb, kSize, CU_MEM_ACCESS_FLAGS_PROT_READ)).ok);
  EXPECT_TRUE(Must(peer, Cmd("checkpat", vb, kSize, 99)).ok);
  ASSERT_TRUE(Must(peer, Cmd("unmap", vb, kSize)).ok);
  ASSERT_TRUE(Must(peer, Cmd("addrfree", vb, kSize)).ok);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), kSize) << "the peer's handle reference remains");
  ASSERT_TRUE(Must(peer, Cmd("release", hb)).ok);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  ps = Stats(peer);
  THAW_EMU_CHECK(EXPECT_EQ(ps.process_bytes, 0u));
  THAW_EMU_CHECK(EXPECT_EQ(ps.handle_refs, 0u));
  THAW_EMU_CHECK(EXPECT_EQ(ps.reservations, 0u));
}

// A killed importer's reference goes with it, and memory the exporter still holds stays.
TEST_F(VmmIpc, KilledImporterDropsOnlyItsOwnReference) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  Mapped m = CreateMapped(kGranularity, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  WritePattern(m.va, kGranularity, 5);
  int fd = Export(m.handle);
  PeerReply imported = peer.Call("import", fd);
  close(fd);
  ASSERT_TRUE(imported.ok) << imported.line;
  uint64_t vb = Must(peer, Cmd("reserve", kGranularity)).U64(0);
  ASSERT_TRUE(Must(peer, Cmd("map", vb, kGranularity, 0, imported.U64(0))).ok);
  peer.Kill();
  THAW_EMU_CHECK(EXPECT_EQ(WaitForDeviceBytes(baseline_.device_bytes_in_use + kGranularity),
                           baseline_.device_bytes_in_use + kGranularity));
  EXPECT_EQ(CheckPattern(m.va, kGranularity, 5), -1);
  Destroy(m);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// A handle imported in another process is that process's: the peer cannot release,
// export or map with a value it never obtained.
TEST_F(VmmIpc, HandleValuesDoNotCrossProcesses) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  CUmemGenericAllocationHandle h = Create(kGranularity, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  PeerReply r = peer.Call(Cmd("release", h));
  EXPECT_FALSE(r.ok) << "the peer released a handle value it never had: " << r.line;
  EXPECT_EQ(r.code, CUDA_ERROR_INVALID_VALUE) << r.line;
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), kGranularity));
  EXPECT_CU_OK(cuMemRelease(h));
}

// ---------------------------------------------------------------------------------------
// Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle)
// ---------------------------------------------------------------------------------------

std::string IpcHandleHex(const CUipcMemHandle& h) {
  return ToHex(&h, sizeof h);
}

TEST_F(VmmIpcLegacy, PeerOpensTheHandleWritesAndTheExporterSeesTheBytes) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  constexpr size_t kSize = 1 << 20;
  CUdeviceptr p = 0;
  ASSERT_CU_OK(cuMemAlloc(&p, kSize));
  ASSERT_CU_OK(cuMemsetD8(p, 0, kSize));
  ASSERT_CU_OK(cuCtxSynchronize());  // memsets are asynchronous: finish before the peer writes
  CUipcMemHandle ipc{};
  ASSERT_CU_OK(cuIpcGetMemHandle(&ipc, p));

  PeerReply opened = Must(peer, Cmd("ipcopen", IpcHandleHex(ipc)));
  ASSERT_TRUE(opened.ok);
  uint64_t q = opened.U64(0);
  std::vector<uint8_t> bytes(4096);
  FillPattern(bytes.data(), bytes.size(), 314);
  ASSERT_TRUE(Must(peer, Cmd("h2d", q + 8192, ToHex(bytes.data(), bytes.size()))).ok);
  THAW_EMU_CHECK(EXPECT_EQ(Stats(peer).ipc_mappings, 1u));

  std::vector<uint8_t> back(bytes.size());
  ASSERT_CU_OK(cuMemcpyDtoH(back.data(), p + 8192, back.size()));
  EXPECT_EQ(back, bytes);
  ASSERT_CU_OK(cuMemsetD8(p, 0xee, 16));
  ASSERT_CU_OK(cuCtxSynchronize());
  PeerReply seen = Must(peer, Cmd("d2h", q, 16));
  EXPECT_EQ(seen.values.size() == 1 ? seen.values[0] : "", std::string(32, 'e'))
      << "the peer sees the exporter's memset";

  ASSERT_TRUE(Must(peer, Cmd("ipcclose", q)).ok);
  THAW_EMU_CHECK(EXPECT_EQ(Stats(peer).ipc_mappings, 0u));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), kSize) << "closing in the importer leaves the allocation");
  EXPECT_CU_OK(cuMemFree(p));
}

// "If the memory handle has already been opened by the current context, the reference
// count on the handle is incremented by 1 and the existing device pointer is returned."
TEST_F(VmmIpcLegacy, OpeningTwiceInOneProcessReturnsTheSamePointerAndCountsReferences) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  CUdeviceptr p = 0;
  ASSERT_CU_OK(cuMemAlloc(&p, 1 << 20));
  CUipcMemHandle ipc{};
  ASSERT_CU_OK(cuIpcGetMemHandle(&ipc, p));
  uint64_t q1 = Must(peer, Cmd("ipcopen", IpcHandleHex(ipc))).U64(0);
  uint64_t q2 = Must(peer, Cmd("ipcopen", IpcHandleHex(ipc))).U64(0);
  EXPECT_EQ(q1, q2);
  ASSERT_TRUE(Must(peer, Cmd("ipcclose", q1)).ok);
  EXPECT_TRUE(Must(peer, Cmd("d2h", q1, 8)).ok) << "one reference left: still mapped";
  ASSERT_TRUE(Must(peer, Cmd("ipcclose", q1)).ok);
  PeerReply third = peer.Call(Cmd("ipcclose", q1));
  EXPECT_EQ(third.code, CUDA_ERROR_INVALID_VALUE) << third.line;
  EXPECT_CU_OK(cuMemFree(p));
}

// Legacy IPC does not work on VMM memory (cuMemCreate-backed): CUDA_ERROR_INVALID_VALUE.
TEST_F(VmmIpcLegacy, GetMemHandleOnVmmMemoryIsInvalidValue) {
  Mapped m = CreateMapped(kGranularity, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUipcMemHandle ipc{};
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(&ipc, m.va));
  Destroy(m);
}

TEST_F(VmmIpcLegacy, GetMemHandleRejectsNullOutputAndNonDevicePointer) {
  CUdeviceptr p = 0;
  ASSERT_CU_OK(cuMemAlloc(&p, 1 << 20));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(nullptr, p));
  CUipcMemHandle ipc{};
  int local = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuIpcGetMemHandle(&ipc, reinterpret_cast<CUdeviceptr>(&local)));
  EXPECT_CU_OK(cuMemFree(p));
}

// A process cannot open its own handle: CUDA_ERROR_INVALID_CONTEXT (design fact, as the
// real driver does).
TEST_F(VmmIpcLegacy, OpeningAHandleInItsOwnProcessIsInvalidContext) {
  CUdeviceptr p = 0;
  ASSERT_CU_OK(cuMemAlloc(&p, 1 << 20));
  CUipcMemHandle ipc{};
  ASSERT_CU_OK(cuIpcGetMemHandle(&ipc, p));
  CUdeviceptr q = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_CONTEXT,
            cuIpcOpenMemHandle(&q, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().ipc_mappings, baseline_.ipc_mappings));
  EXPECT_CU_OK(cuMemFree(p));
}

// cuIpcCloseMemHandle: "dptr - Device pointer returned by cuIpcOpenMemHandle".
TEST_F(VmmIpcLegacy, ClosingAPointerNotFromOpenIsInvalidValue) {
  CUdeviceptr p = 0;
  ASSERT_CU_OK(cuMemAlloc(&p, 1 << 20));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuIpcCloseMemHandle(p));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuIpcCloseMemHandle(0));
  Mapped m = CreateMapped(kGranularity);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuIpcCloseMemHandle(m.va));
  Destroy(m);
  EXPECT_CU_OK(cuMemFree(p));
}

TEST_F(VmmIpcLegacy, OpeningAGarbageHandleFailsInThePeer) {
  EmuPeer peer;
  StartPeer(peer);
  if (HasFatalFailure()) return;
  CUipcMemHandle junk{};
  std::memset(&junk, 0x5a, sizeof junk);
  PeerReply r = peer.Call(Cmd("ipcopen", IpcHandleHex(junk)));
  EXPECT_FALSE(r.ok) << r.line;
  // cuda.h lists INVALID_HANDLE and INVALID_VALUE (and MAP_FAILED) for cuIpcOpenMemHandle
  // without saying which a handle naming no allocation gives.
  EXPECT_TRUE(r.code == CUDA_ERROR_INVALID_VALUE || r.code == CUDA_ERROR_INVALID_HANDLE ||
              r.code == CUDA_ERROR_MAP_FAILED)
      << r.line;
}

}  // namespace
}  // namespace thaw_vmm_test
