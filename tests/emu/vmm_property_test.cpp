// Randomized property test of the emulator's VMM across processes.
//
// The test process and three emu_peer processes share one small emulated GPU. A seeded
// random sequence of several thousand operations (create, release, reserve, free, map,
// unmap, set access, write, verify, retain, export → import in another process, misuse
// that must fail, and now and then a peer killed with SIGKILL and replaced) runs against
// a model of what every process holds. After each step the model's expectations are
// checked: the result code of the call, the bytes read back, the device-wide bytes in
// use and free memory, and (every few steps) each process's own counts. At the end every
// process releases everything, and the device must show zero bytes, handles and mappings.
//
// THAW_EMU_PROPERTY_SEED=<n> replays a sequence, THAW_EMU_PROPERTY_STEPS=<n> changes its
// length. The seed is printed at the start and with every failure.
#include <gtest/gtest.h>

#include <cuda.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "thaw/emu_inspect.h"
#include "vmm_helpers.hpp"

namespace thaw_vmm_test {
namespace {

// A small device, so that out-of-memory happens during the run. Set before main (and so
// before cuInit); peers inherit it.
const bool kDeviceConfigured = [] {
  setenv("THAW_EMU_DEVICE_MEMORY", "160M", 1);
  return true;
}();

constexpr size_t G = kGranularity;
constexpr uint64_t kDefaultSeed = 0x7468617721ull;  // "thaw!"
constexpr int kDefaultSteps = 6000;
constexpr int kPeers = 3;
constexpr size_t kMaxReservations = 4;
constexpr size_t kMaxReservationPages = 16;
constexpr size_t kMaxAllocationPages = 6;

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  uint64_t out;
  return (v != nullptr && ParseU64(v, &out)) ? out : fallback;
}

// ---------------------------------------------------------------------------------------
// Actors: the same operations, run in this process or in a peer
// ---------------------------------------------------------------------------------------

struct Counts {
  uint64_t device_bytes = 0, process_bytes = 0, physical_allocations = 0, handle_refs = 0,
           mappings = 0, reservations = 0, reserved_bytes = 0;
};

class Actor {
 public:
  virtual ~Actor() = default;
  virtual CUresult Create(size_t size, bool exportable, CUmemGenericAllocationHandle* h) = 0;
  virtual CUresult Release(CUmemGenericAllocationHandle h) = 0;
  virtual CUresult Reserve(size_t size, size_t alignment, CUdeviceptr* va) = 0;
  virtual CUresult AddressFree(CUdeviceptr va, size_t size) = 0;
  virtual CUresult Map(CUdeviceptr va, size_t size, size_t offset,
                       CUmemGenericAllocationHandle h) = 0;
  virtual CUresult Unmap(CUdeviceptr va, size_t size) = 0;
  virtual CUresult SetAccess(CUdeviceptr va, size_t size, unsigned flags) = 0;
  virtual CUresult GetAccess(CUdeviceptr va, unsigned long long* flags) = 0;
  virtual CUresult Retain(CUdeviceptr addr, CUmemGenericAllocationHandle* h) = 0;
  virtual CUresult Write(CUdeviceptr va, const std::vector<uint8_t>& bytes, bool driver) = 0;
  virtual CUresult Read(CUdeviceptr va, size_t len, bool driver, std::vector<uint8_t>* out) = 0;
  // Export gives a descriptor the caller owns; Import does not take the descriptor.
  virtual CUresult Export(CUmemGenericAllocationHandle h, int* fd) = 0;
  virtual CUresult Import(int fd, CUmemGenericAllocationHandle* h) = 0;
  virtual bool GetCounts(Counts* out) = 0;
};

class LocalActor final : public Actor {
 public:
  CUresult Create(size_t size, bool exportable, CUmemGenericAllocationHandle* h) override {
    CUmemAllocationProp prop = DeviceProp(
        0, exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE);
    return cuMemCreate(h, size, &prop, 0);
  }
  CUresult Release(CUmemGenericAllocationHandle h) override { return cuMemRelease(h); }
  CUresult Reserve(size_t size, size_t alignment, CUdeviceptr* va) override {
    return cuMemAddressReserve(va, size, alignment, 0, 0);
  }
  CUresult AddressFree(CUdeviceptr va, size_t size) override { return cuMemAddressFree(va, size); }
  CUresult Map(CUdeviceptr va, size_t size, size_t offset,
               CUmemGenericAllocationHandle h) override {
    return cuMemMap(va, size, offset, h, 0);
  }
  CUresult Unmap(CUdeviceptr va, size_t size) override { return cuMemUnmap(va, size); }
  CUresult SetAccess(CUdeviceptr va, size_t size, unsigned flags) override {
    CUmemAccessDesc desc = AccessDesc(static_cast<CUmemAccess_flags>(flags));
    return cuMemSetAccess(va, size, &desc, 1);
  }
  CUresult GetAccess(CUdeviceptr va, unsigned long long* flags) override {
    CUmemLocation loc = DeviceLocation();
    return cuMemGetAccess(flags, &loc, va);
  }
  CUresult Retain(CUdeviceptr addr, CUmemGenericAllocationHandle* h) override {
    return cuMemRetainAllocationHandle(h, AsPtr(addr));
  }
  CUresult Write(CUdeviceptr va, const std::vector<uint8_t>& bytes, bool driver) override {
    if (driver) return cuMemcpyHtoD(va, bytes.data(), bytes.size());
    std::memcpy(AsPtr(va), bytes.data(), bytes.size());
    return CUDA_SUCCESS;
  }
  CUresult Read(CUdeviceptr va, size_t len, bool driver, std::vector<uint8_t>* out) override {
    out->assign(len, 0);
    if (driver) return cuMemcpyDtoH(out->data(), va, len);
    std::memcpy(out->data(), AsPtr(va), len);
    return CUDA_SUCCESS;
  }
  CUresult Export(CUmemGenericAllocationHandle h, int* fd) override {
    return cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  }
  CUresult Import(int fd, CUmemGenericAllocationHandle* h) override {
    return cuMemImportFromShareableHandle(h, AsOsHandle(fd),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  }
  bool GetCounts(Counts* out) override {
    ThawEmuDeviceStats d{};
    ThawEmuProcessStats p{};
    if (thawEmuGetDeviceStats(0, &d) != 0 || thawEmuGetProcessStats(&p) != 0) return false;
    *out = {d.device_bytes_in_use, d.process_bytes_in_use, d.physical_allocations,
            d.vmm_handle_refs,     d.vmm_mappings,         p.reservations,
            p.reserved_bytes};
    return true;
  }
};

class RemoteActor final : public Actor {
 public:
  explicit RemoteActor(EmuPeer* peer) : peer_(peer) {}

  CUresult Create(size_t size, bool exportable, CUmemGenericAllocationHandle* h) override {
    return Value(Cmd("create", size, exportable ? 1 : 0), h);
  }
  CUresult Release(CUmemGenericAllocationHandle h) override { return Plain(Cmd("release", h)); }
  CUresult Reserve(size_t size, size_t alignment, CUdeviceptr* va) override {
    return Value(Cmd("reserve", size, alignment), va);
  }
  CUresult AddressFree(CUdeviceptr va, size_t size) override {
    return Plain(Cmd("addrfree", va, size));
  }
  CUresult Map(CUdeviceptr va, size_t size, size_t offset,
               CUmemGenericAllocationHandle h) override {
    return Plain(Cmd("map", va, size, offset, h));
  }
  CUresult Unmap(CUdeviceptr va, size_t size) override { return Plain(Cmd("unmap", va, size)); }
  CUresult SetAccess(CUdeviceptr va, size_t size, unsigned flags) override {
    return Plain(Cmd("access", va, size, flags));
  }
  CUresult GetAccess(CUdeviceptr va, unsigned long long* flags) override {
    return Value(Cmd("getaccess", va), flags);
  }
  CUresult Retain(CUdeviceptr addr, CUmemGenericAllocationHandle* h) override {
    return Value(Cmd("retain", addr), h);
  }
  CUresult Write(CUdeviceptr va, const std::vector<uint8_t>& bytes, bool driver) override {
    return Plain(Cmd(driver ? "h2d" : "poke", va, ToHex(bytes.data(), bytes.size())));
  }
  CUresult Read(CUdeviceptr va, size_t len, bool driver, std::vector<uint8_t>* out) override {
    PeerReply r = Call(Cmd(driver ? "d2h" : "peek", va, len));
    if (!r.ok) return r.code;
    if (r.values.size() != 1 || !FromHex(r.values[0], out) || out->size() != len) {
      ADD_FAILURE() << "malformed read reply: " << r.line;
      return CUDA_ERROR_UNKNOWN;
    }
    return CUDA_SUCCESS;
  }
  CUresult Export(CUmemGenericAllocationHandle h, int* fd) override {
    PeerReply r = Call(Cmd("export", h));
    if (r.ok && r.fd < 0) {
      ADD_FAILURE() << "export reply without a descriptor";
      return CUDA_ERROR_UNKNOWN;
    }
    *fd = r.fd;
    return r.code;
  }
  CUresult Import(int fd, CUmemGenericAllocationHandle* h) override {
    PeerReply r = Call("import", fd);
    if (r.ok) *h = r.U64(0);
    return r.code;
  }
  bool GetCounts(Counts* out) override {
    PeerReply r = Call("stats");
    if (!r.ok || r.values.size() != 9) return false;
    *out = {r.U64(0), r.U64(1), r.U64(2), r.U64(3), r.U64(4), r.U64(7), r.U64(8)};
    return true;
  }

 private:
  PeerReply Call(const std::string& command, int fd = -1) {
    PeerReply r = peer_->Call(command, fd);
    if (!r.ok && r.line.rfind("ERR ", 0) != 0) {
      ADD_FAILURE() << "peer protocol failure on '" << command << "': " << r.line;
      r.code = CUDA_ERROR_UNKNOWN;
    }
    if (r.fd >= 0 && command.rfind("export", 0) != 0) {
      close(r.fd);
      r.fd = -1;
    }
    return r;
  }
  CUresult Plain(const std::string& command) { return Call(command).code; }
  template <typename T>
  CUresult Value(const std::string& command, T* out) {
    PeerReply r = Call(command);
    if (r.ok) *out = static_cast<T>(r.U64(0));
    return r.code;
  }

  EmuPeer* peer_;
};

// ---------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------

struct Allocation {
  size_t pages = 0;
  bool exportable = false;
  bool alive = true;
  std::unordered_map<uint64_t, uint8_t> bytes;  // offset → last byte written there
  std::vector<uint64_t> written;                // some offsets written, for verification
};

struct HandleRef {
  CUmemGenericAllocationHandle value = 0;
  int alloc = -1;
  int count = 0;
};

struct Mapping {
  CUdeviceptr va = 0;
  size_t pages = 0;
  int alloc = -1;
  size_t offset_pages = 0;
  CUmemGenericAllocationHandle handle = 0;  // the value it was mapped with
  unsigned access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
};

struct Reservation {
  CUdeviceptr va = 0;
  size_t pages = 0;
  std::vector<bool> mapped;  // per page
};

// What one process holds. Vectors keep creation order, so random choices do not depend
// on addresses or handle values (which vary between runs).
struct ProcessModel {
  std::vector<HandleRef> refs;
  std::vector<Reservation> reservations;
  std::vector<Mapping> mappings;
};

enum Op {
  kCreate,
  kRelease,
  kReserve,
  kAddressFree,
  kMap,
  kMapMisuse,
  kSetAccess,
  kSetAccessMisuse,
  kWrite,
  kVerify,
  kUnmap,
  kUnmapMisuse,
  kRetain,
  kRetainMisuse,
  kExport,
  kExportMisuse,
  kKillPeer,
  kOpCount
};
constexpr std::array<const char*, kOpCount> kOpNames = {
    "create", "release",       "reserve", "addrfree",      "map",      "map-misuse",
    "access", "access-misuse", "write",   "verify",        "unmap",    "unmap-misuse",
    "retain", "retain-misuse", "export",  "export-misuse", "kill-peer"};
// Relative weights (per mille for kill-peer).
constexpr std::array<int, kOpCount> kOpWeights = {100, 80, 40, 30, 150, 30, 100, 20, 120,
                                                  120, 90, 20, 40, 10,  70, 10,  2};

class VmmProperty : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = EnvU64("THAW_EMU_PROPERTY_SEED", kDefaultSeed);
    steps_ = static_cast<int>(EnvU64("THAW_EMU_PROPERTY_STEPS", kDefaultSteps));
    std::printf("vmm property test: seed %" PRIu64 ", %d steps (THAW_EMU_PROPERTY_SEED=%" PRIu64
                " replays it)\n",
                seed_, steps_, seed_);
    RecordProperty("seed", std::to_string(seed_));
    rng_.seed(seed_);
    ASSERT_TRUE(kDeviceConfigured);
    ASSERT_CU_OK(cuInit(0));
    ASSERT_CU_OK(cuDeviceGet(&dev_, 0));
    ASSERT_CU_OK(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU_OK(cuCtxSetCurrent(ctx_));
    actors_.push_back(std::make_unique<LocalActor>());
    procs_.resize(1 + kPeers);
    peers_.resize(kPeers);
    for (int i = 0; i < kPeers; ++i) {
      StartPeer(i);
      if (HasFatalFailure()) return;
      actors_.push_back(std::make_unique<RemoteActor>(peers_[i].get()));
    }
    ASSERT_TRUE(actors_[0]->GetCounts(&baseline_));
    size_t total = 0;
    ASSERT_CU_OK(cuMemGetInfo(&free0_, &total));
  }

  void TearDown() override {
    for (auto& p : peers_) {
      if (p) p->Kill();
    }
    if (ctx_ != nullptr) {
      cuCtxSetCurrent(nullptr);
      cuDevicePrimaryCtxRelease(dev_);
    }
  }

  void StartPeer(int i) {
    peers_[i] = std::make_unique<EmuPeer>();
    std::string error;
    ASSERT_TRUE(peers_[i]->Start(&error)) << error;
    PeerReply r = peers_[i]->Call("init");
    ASSERT_TRUE(r.ok) << r.line;
  }

  // ---- random choices ----
  size_t Uniform(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  size_t Between(size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int PickProcess() { return Chance(0.4) ? 0 : 1 + static_cast<int>(Uniform(kPeers)); }
  Op PickOp() {
    int sum = 0;
    for (int w : kOpWeights) sum += w;
    int x = static_cast<int>(Uniform(static_cast<size_t>(sum)));
    for (int i = 0; i < kOpCount; ++i) {
      if (x < kOpWeights[i]) return static_cast<Op>(i);
      x -= kOpWeights[i];
    }
    return kCreate;
  }

  // ---- model queries ----
  uint64_t UsedBytes() const {
    uint64_t sum = 0;
    for (const Allocation& a : allocs_) {
      if (a.alive) sum += a.pages * G;
    }
    return sum;
  }

  bool Referenced(int alloc) const {
    for (const ProcessModel& p : procs_) {
      for (const HandleRef& r : p.refs) {
        if (r.alloc == alloc && r.count > 0) return true;
      }
      for (const Mapping& m : p.mappings) {
        if (m.alloc == alloc) return true;
      }
    }
    return false;
  }

  void CollectGarbage() {
    for (int i = 0; i < static_cast<int>(allocs_.size()); ++i) {
      if (allocs_[i].alive && !Referenced(i)) {
        allocs_[i].alive = false;
        allocs_[i].bytes.clear();
        allocs_[i].written.clear();
      }
    }
  }

  Counts Expected(int proc) const {
    const ProcessModel& p = procs_[proc];
    Counts c;
    c.device_bytes = baseline_.device_bytes + UsedBytes();
    std::vector<int> held;
    for (const HandleRef& r : p.refs) {
      c.handle_refs += static_cast<uint64_t>(r.count);
      if (r.count > 0) held.push_back(r.alloc);
    }
    for (const Mapping& m : p.mappings) held.push_back(m.alloc);
    std::sort(held.begin(), held.end());
    held.erase(std::unique(held.begin(), held.end()), held.end());
    for (int a : held) c.process_bytes += allocs_[a].pages * G;
    c.physical_allocations = held.size();
    c.mappings = p.mappings.size();
    c.reservations = p.reservations.size();
    for (const Reservation& r : p.reservations) c.reserved_bytes += r.pages * G;
    if (proc == 0) {
      c.process_bytes += baseline_.process_bytes;
      c.physical_allocations += baseline_.physical_allocations;
      c.handle_refs += baseline_.handle_refs;
      c.mappings += baseline_.mappings;
      c.reservations += baseline_.reservations;
      c.reserved_bytes += baseline_.reserved_bytes;
    }
    return c;
  }

  void CheckCounts(int proc, bool device_only = false) {
    Counts got;
    ASSERT_TRUE(actors_[proc]->GetCounts(&got)) << "stats of process " << proc;
    Counts want = Expected(proc);
    EXPECT_EQ(got.device_bytes, want.device_bytes) << "device bytes in use, seen by " << proc;
    if (device_only) return;
    EXPECT_EQ(got.process_bytes, want.process_bytes) << "process bytes of " << proc;
    EXPECT_EQ(got.physical_allocations, want.physical_allocations) << "allocations of " << proc;
    EXPECT_EQ(got.handle_refs, want.handle_refs) << "handle refs of " << proc;
    EXPECT_EQ(got.mappings, want.mappings) << "mappings of " << proc;
    EXPECT_EQ(got.reservations, want.reservations) << "reservations of " << proc;
    EXPECT_EQ(got.reserved_bytes, want.reserved_bytes) << "reserved bytes of " << proc;
  }

  void CheckFreeMemory() {
    size_t free = 0, total = 0;
    ASSERT_CU_OK(cuMemGetInfo(&free, &total));
    EXPECT_EQ(free, free0_ - UsedBytes()) << "cuMemGetInfo free";
  }

  HandleRef* FindRef(int proc, CUmemGenericAllocationHandle value) {
    for (HandleRef& r : procs_[proc].refs) {
      if (r.value == value) return &r;
    }
    return nullptr;
  }

  // Records a new reference to `alloc` under `value` in `proc`. A value the process
  // already uses for another allocation (by a live reference or a mapping) would make
  // cuMemRetainAllocationHandle ambiguous: that is a failure.
  void AddRef(int proc, CUmemGenericAllocationHandle value, int alloc) {
    for (const Mapping& m : procs_[proc].mappings) {
      EXPECT_FALSE(m.handle == value && m.alloc != alloc)
          << "handle value " << Hex(value) << " reused while another allocation is mapped";
    }
    HandleRef* r = FindRef(proc, value);
    if (r != nullptr) {
      EXPECT_EQ(r->alloc, alloc) << "handle value " << Hex(value) << " names two allocations";
      ++r->count;
      return;
    }
    procs_[proc].refs.push_back({value, alloc, 1});
  }

  // A random live reference of `proc` satisfying `pred`, or nullptr.
  template <typename Pred>
  HandleRef* PickRef(int proc, Pred pred) {
    std::vector<HandleRef*> c;
    for (HandleRef& r : procs_[proc].refs) {
      if (r.count > 0 && pred(r)) c.push_back(&r);
    }
    return c.empty() ? nullptr : c[Uniform(c.size())];
  }

  template <typename Pred>
  int PickMapping(int proc, Pred pred) {
    std::vector<int> c;
    for (int i = 0; i < static_cast<int>(procs_[proc].mappings.size()); ++i) {
      if (pred(procs_[proc].mappings[i])) c.push_back(i);
    }
    return c.empty() ? -1 : c[Uniform(c.size())];
  }

  Reservation* ReservationOf(int proc, CUdeviceptr va) {
    for (Reservation& r : procs_[proc].reservations) {
      if (va >= r.va && va < r.va + r.pages * G) return &r;
    }
    return nullptr;
  }

  int MappingAt(int proc, CUdeviceptr va) {
    for (int i = 0; i < static_cast<int>(procs_[proc].mappings.size()); ++i) {
      if (procs_[proc].mappings[i].va == va) return i;
    }
    return -1;
  }

  // Mapping `first` followed by up to all adjacent mappings, each taken with probability
  // `p_more`: a contiguous run of whole mappings. Returns their indices and total pages.
  std::vector<int> AdjacentRun(int proc, int first, double p_more, size_t* pages) {
    std::vector<int> run{first};
    *pages = procs_[proc].mappings[first].pages;
    while (Chance(p_more)) {
      const Mapping& last = procs_[proc].mappings[run.back()];
      int next = MappingAt(proc, last.va + last.pages * G);
      if (next < 0) break;
      run.push_back(next);
      *pages += procs_[proc].mappings[next].pages;
    }
    return run;
  }

  // A free run of `pages` pages in a random reservation of `proc`: its address, or 0.
  CUdeviceptr FreeSpot(int proc, size_t pages) {
    auto& rs = procs_[proc].reservations;
    if (rs.empty()) return 0;
    Reservation& r = rs[Uniform(rs.size())];
    std::vector<size_t> starts;
    for (size_t s = 0; s + pages <= r.pages; ++s) {
      bool free = true;
      for (size_t i = s; i < s + pages && free; ++i) free = !r.mapped[i];
      if (free) starts.push_back(s);
    }
    return starts.empty() ? 0 : r.va + starts[Uniform(starts.size())] * G;
  }

  void MarkPages(int proc, CUdeviceptr va, size_t pages, bool mapped) {
    Reservation* r = ReservationOf(proc, va);
    ASSERT_NE(r, nullptr);
    size_t first = (va - r->va) / G;
    for (size_t i = first; i < first + pages; ++i) r->mapped[i] = mapped;
  }

  void Note(const std::string& what) {
    history_.push_back("#" + std::to_string(step_) + " " + what);
    if (history_.size() > 40) history_.pop_front();
  }

  // ---- operations; each returns false when its precondition did not hold ----

  bool DoCreate(int p) {
    size_t pages = Between(1, kMaxAllocationPages);
    bool exportable = Chance(0.75);
    Note(fmtP(p) + " create " + std::to_string(pages) + (exportable ? " posix" : " none"));
    CUresult want = UsedBytes() + pages * G > free0_ ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (want == CUDA_ERROR_OUT_OF_MEMORY) ++oom_;
    CUmemGenericAllocationHandle h = 0;
    EXPECT_CU(want, actors_[p]->Create(pages * G, exportable, &h));
    if (want == CUDA_SUCCESS && h != 0) {
      allocs_.push_back({pages, exportable});
      AddRef(p, h, static_cast<int>(allocs_.size()) - 1);
    }
    return true;
  }

  bool DoRelease(int p) {
    HandleRef* r = PickRef(p, [](const HandleRef&) { return true; });
    if (r == nullptr) return false;
    Note(fmtP(p) + " release " + Hex(r->value));
    EXPECT_CU_OK(actors_[p]->Release(r->value));
    if (--r->count == 0) {
      auto& refs = procs_[p].refs;
      refs.erase(refs.begin() + (r - refs.data()));
    }
    CollectGarbage();
    return true;
  }

  bool DoReserve(int p) {
    if (procs_[p].reservations.size() >= kMaxReservations) return false;
    size_t pages = Between(1, kMaxReservationPages);
    static constexpr size_t kAlignments[] = {0, 0, 2 * G, 8 * G};
    size_t alignment = kAlignments[Uniform(4)];
    Note(fmtP(p) + " reserve " + std::to_string(pages) + " align " + std::to_string(alignment));
    CUdeviceptr va = 0;
    EXPECT_CU_OK(actors_[p]->Reserve(pages * G, alignment, &va));
    if (va == 0) return true;
    EXPECT_EQ(va % std::max(alignment, G), 0u) << "reservation alignment";
    procs_[p].reservations.push_back({va, pages, std::vector<bool>(pages, false)});
    return true;
  }

  bool DoAddressFree(int p) {
    auto& rs = procs_[p].reservations;
    if (rs.empty()) return false;
    size_t i = Uniform(rs.size());
    Reservation r = rs[i];
    bool busy = std::find(r.mapped.begin(), r.mapped.end(), true) != r.mapped.end();
    Note(fmtP(p) + " addrfree " + Hex(r.va) + (busy ? " (mapped: must fail)" : ""));
    CUresult got = actors_[p]->AddressFree(r.va, r.pages * G);
    if (busy) {
      EXPECT_TRUE(got == CUDA_ERROR_INVALID_VALUE || got == CUDA_ERROR_NOT_PERMITTED)
          << "freeing a mapped reservation returned " << CuName(got);
    } else {
      EXPECT_CU(CUDA_SUCCESS, got);
      rs.erase(rs.begin() + static_cast<long>(i));
    }
    return true;
  }

  bool DoMap(int p) {
    HandleRef* r = PickRef(p, [](const HandleRef&) { return true; });
    if (r == nullptr) return false;
    const Allocation& a = allocs_[r->alloc];
    size_t pages = Between(1, std::min(a.pages, kMaxReservationPages));
    size_t offset = Between(0, a.pages - pages);
    CUdeviceptr va = FreeSpot(p, pages);
    if (va == 0) return false;
    Note(fmtP(p) + " map " + Hex(va) + " pages " + std::to_string(pages) + " offset " +
         std::to_string(offset) + " alloc " + std::to_string(r->alloc));
    EXPECT_CU_OK(actors_[p]->Map(va, pages * G, offset * G, r->value));
    procs_[p].mappings.push_back({va, pages, r->alloc, offset, r->value});
    MarkPages(p, va, pages, true);
    return true;
  }

  bool DoMapMisuse(int p) {
    HandleRef* r = PickRef(p, [](const HandleRef&) { return true; });
    if (r == nullptr) return false;
    const Allocation& a = allocs_[r->alloc];
    CUdeviceptr va = 0;
    size_t size = G, offset = 0;
    std::string kind;
    switch (Uniform(3)) {
      case 0: {  // over an existing mapping
        int m = PickMapping(p, [](const Mapping&) { return true; });
        if (m < 0) return false;
        va = procs_[p].mappings[m].va + G * Uniform(procs_[p].mappings[m].pages);
        kind = "over a mapping";
        break;
      }
      case 1:  // offset + size beyond the allocation
        va = FreeSpot(p, 1);
        offset = a.pages * G;
        kind = "beyond the allocation";
        break;
      default:  // offset not a multiple of the granularity
        va = FreeSpot(p, 1);
        offset = 4096;
        kind = "unaligned offset";
        break;
    }
    if (va == 0) return false;
    Note(fmtP(p) + " map-misuse " + kind + " at " + Hex(va));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, actors_[p]->Map(va, size, offset, r->value)) << kind;
    return true;
  }

  bool DoSetAccess(int p) {
    int first = PickMapping(p, [](const Mapping&) { return true; });
    if (first < 0) return false;
    size_t pages = 0;
    std::vector<int> run = AdjacentRun(p, first, 0.5, &pages);
    static constexpr unsigned kFlags[] = {
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READ,
        CU_MEM_ACCESS_FLAGS_PROT_NONE};
    unsigned flags = kFlags[Uniform(5)];
    CUdeviceptr va = procs_[p].mappings[first].va;
    Note(fmtP(p) + " access " + Hex(va) + " pages " + std::to_string(pages) + " flags " +
         std::to_string(flags));
    EXPECT_CU_OK(actors_[p]->SetAccess(va, pages * G, flags));
    for (int i : run) procs_[p].mappings[i].access = flags;
    return true;
  }

  bool DoSetAccessMisuse(int p) {
    // A mapping plus the unmapped page after it (inside the reservation).
    int m = PickMapping(p, [&](const Mapping& m) {
      Reservation* r = ReservationOf(p, m.va);
      size_t next = (m.va - r->va) / G + m.pages;
      return next < r->pages && !r->mapped[next];
    });
    if (m < 0) return false;
    const Mapping& mm = procs_[p].mappings[m];
    Note(fmtP(p) + " access-misuse " + Hex(mm.va) + " one page past the mapping");
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
              actors_[p]->SetAccess(mm.va, (mm.pages + 1) * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    return true;
  }

  bool DoWrite(int p) {
    int m = PickMapping(
        p, [](const Mapping& m) { return m.access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE; });
    if (m < 0) return false;
    const Mapping& mm = procs_[p].mappings[m];
    size_t len = Between(1, 48);
    size_t off = Between(0, mm.pages * G - len);
    if (mm.pages > 1 && Chance(0.3)) {
      // Straddle a page boundary inside the mapping: the bytes land in two pages.
      off = Between(1, mm.pages - 1) * G - len / 2;
    }
    std::vector<uint8_t> bytes(len);
    for (auto& b : bytes) b = static_cast<uint8_t>(Uniform(256));
    bool driver = Chance(0.5);
    Note(fmtP(p) + " write " + Hex(mm.va + off) + " len " + std::to_string(len) +
         (driver ? " driver" : " cpu"));
    EXPECT_CU_OK(actors_[p]->Write(mm.va + off, bytes, driver));
    Allocation& a = allocs_[mm.alloc];
    uint64_t base = mm.offset_pages * G + off;
    for (size_t i = 0; i < len; ++i) a.bytes[base + i] = bytes[i];
    if (a.written.size() < 64) {
      a.written.push_back(base);
    } else {
      a.written[Uniform(a.written.size())] = base;
    }
    return true;
  }

  bool DoVerify(int p) {
    int m = PickMapping(
        p, [](const Mapping& m) { return (m.access & CU_MEM_ACCESS_FLAGS_PROT_READ) != 0; });
    if (m < 0) return false;
    const Mapping& mm = procs_[p].mappings[m];
    const Allocation& a = allocs_[mm.alloc];
    uint64_t lo = mm.offset_pages * G, hi = lo + mm.pages * G;  // window in the allocation
    std::vector<uint64_t> inside;
    for (uint64_t w : a.written) {
      if (w >= lo && w < hi) inside.push_back(w);
    }
    uint64_t at = inside.empty() || Chance(0.1) ? lo + Between(0, mm.pages * G - 1)
                                                : inside[Uniform(inside.size())];
    at = std::max(lo, at >= 16 ? at - 16 : 0);
    size_t len = static_cast<size_t>(std::min<uint64_t>(64, hi - at));
    bool driver = Chance(0.5);
    Note(fmtP(p) + " verify " + Hex(mm.va + (at - lo)) + " len " + std::to_string(len) +
         (driver ? " driver" : " cpu"));
    std::vector<uint8_t> got;
    EXPECT_CU_OK(actors_[p]->Read(mm.va + (at - lo), len, driver, &got));
    for (size_t i = 0; i < got.size(); ++i) {
      auto it = a.bytes.find(at + i);
      if (it == a.bytes.end()) continue;  // never written: contents unspecified
      if (got[i] != it->second) {
        ADD_FAILURE() << "byte at allocation offset " << (at + i) << " is " << int(got[i])
                      << ", expected " << int(it->second);
        break;
      }
    }
    unsigned long long flags = 99;
    EXPECT_CU_OK(actors_[p]->GetAccess(mm.va + (at - lo), &flags));
    EXPECT_EQ(flags, mm.access) << "cuMemGetAccess";
    return true;
  }

  bool DoUnmap(int p) {
    int first = PickMapping(p, [](const Mapping&) { return true; });
    if (first < 0) return false;
    size_t pages = 0;
    std::vector<int> run = AdjacentRun(p, first, 0.4, &pages);
    CUdeviceptr va = procs_[p].mappings[first].va;
    Note(fmtP(p) + " unmap " + Hex(va) + " pages " + std::to_string(pages) + " (" +
         std::to_string(run.size()) + " mappings)");
    EXPECT_CU_OK(actors_[p]->Unmap(va, pages * G));
    MarkPages(p, va, pages, false);
    std::sort(run.rbegin(), run.rend());
    for (int i : run) procs_[p].mappings.erase(procs_[p].mappings.begin() + i);
    CollectGarbage();
    return true;
  }

  bool DoUnmapMisuse(int p) {
    int m = PickMapping(p, [](const Mapping& m) { return m.pages >= 2; });
    if (m < 0) return false;
    const Mapping& mm = procs_[p].mappings[m];
    size_t sub = Between(1, mm.pages - 1);
    bool tail = Chance(0.5);
    CUdeviceptr va = tail ? mm.va + (mm.pages - sub) * G : mm.va;
    Note(fmtP(p) + " unmap-misuse " + Hex(va) + " pages " + std::to_string(sub) + " of " +
         std::to_string(mm.pages));
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, actors_[p]->Unmap(va, sub * G));
    return true;
  }

  bool DoRetain(int p) {
    int m = PickMapping(p, [](const Mapping&) { return true; });
    if (m < 0) return false;
    const Mapping mm = procs_[p].mappings[m];
    CUdeviceptr addr = mm.va + Between(0, mm.pages * G - 1);
    Note(fmtP(p) + " retain " + Hex(addr));
    CUmemGenericAllocationHandle h = 0;
    EXPECT_CU_OK(actors_[p]->Retain(addr, &h));
    EXPECT_EQ(h, mm.handle) << "retain must give the handle value used to map";
    if (h == mm.handle) AddRef(p, h, mm.alloc);
    return true;
  }

  bool DoRetainMisuse(int p) {
    CUdeviceptr va = FreeSpot(p, 1);
    if (va == 0) return false;
    Note(fmtP(p) + " retain-misuse " + Hex(va) + " (reserved, unmapped)");
    CUmemGenericAllocationHandle h = 0;
    EXPECT_CU(CUDA_ERROR_INVALID_VALUE, actors_[p]->Retain(va + 4096, &h));
    return true;
  }

  bool DoExport(int p) {
    HandleRef* r = PickRef(p, [&](const HandleRef& r) { return allocs_[r.alloc].exportable; });
    if (r == nullptr) return false;
    int q = static_cast<int>(Uniform(1 + kPeers - 1));
    if (q >= p) ++q;  // another process
    int alloc = r->alloc;
    Note(fmtP(p) + " export " + Hex(r->value) + " → " + fmtP(q));
    int fd = -1;
    EXPECT_CU_OK(actors_[p]->Export(r->value, &fd));
    if (fd < 0) return true;
    CUmemGenericAllocationHandle h = 0;
    EXPECT_CU_OK(actors_[q]->Import(fd, &h));
    close(fd);
    if (h != 0) AddRef(q, h, alloc);
    return true;
  }

  bool DoExportMisuse(int p) {
    HandleRef* r = PickRef(p, [&](const HandleRef& r) { return !allocs_[r.alloc].exportable; });
    if (r == nullptr) return false;
    Note(fmtP(p) + " export-misuse " + Hex(r->value) + " (created without a handle type)");
    int fd = -1;
    CUresult got = actors_[p]->Export(r->value, &fd);
    EXPECT_TRUE(got == CUDA_ERROR_INVALID_VALUE || got == CUDA_ERROR_NOT_PERMITTED ||
                got == CUDA_ERROR_NOT_SUPPORTED)
        << "export of a non-exportable allocation returned " << CuName(got);
    if (fd >= 0) close(fd);
    return true;
  }

  bool DoKillPeer() {
    int i = static_cast<int>(Uniform(kPeers));
    Note("kill peer " + std::to_string(i + 1));
    peers_[i]->Kill();
    procs_[i + 1] = ProcessModel{};
    CollectGarbage();
    // The dead process's memory comes back once the emulator notices the death.
    uint64_t want = baseline_.device_bytes + UsedBytes();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    Counts got;
    while (actors_[0]->GetCounts(&got) && got.device_bytes != want &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(got.device_bytes, want) << "memory of the killed peer";
    StartPeer(i);
    actors_[i + 1] = std::make_unique<RemoteActor>(peers_[i].get());
    return true;
  }

  bool Run(Op op, int p) {
    switch (op) {
      case kCreate:
        return DoCreate(p);
      case kRelease:
        return DoRelease(p);
      case kReserve:
        return DoReserve(p);
      case kAddressFree:
        return DoAddressFree(p);
      case kMap:
        return DoMap(p);
      case kMapMisuse:
        return DoMapMisuse(p);
      case kSetAccess:
        return DoSetAccess(p);
      case kSetAccessMisuse:
        return DoSetAccessMisuse(p);
      case kWrite:
        return DoWrite(p);
      case kVerify:
        return DoVerify(p);
      case kUnmap:
        return DoUnmap(p);
      case kUnmapMisuse:
        return DoUnmapMisuse(p);
      case kRetain:
        return DoRetain(p);
      case kRetainMisuse:
        return DoRetainMisuse(p);
      case kExport:
        return DoExport(p);
      case kExportMisuse:
        return DoExportMisuse(p);
      case kKillPeer:
        return DoKillPeer();
      case kOpCount:
        break;
    }
    return false;
  }

  // Everything released, in every process, in a random order of processes.
  void ReleaseEverything(int p) {
    ProcessModel& pm = procs_[p];
    while (!pm.mappings.empty()) {
      const Mapping m = pm.mappings.back();
      Note(fmtP(p) + " final unmap " + Hex(m.va));
      EXPECT_CU_OK(actors_[p]->Unmap(m.va, m.pages * G));
      MarkPages(p, m.va, m.pages, false);
      pm.mappings.pop_back();
    }
    while (!pm.reservations.empty()) {
      const Reservation r = pm.reservations.back();
      Note(fmtP(p) + " final addrfree " + Hex(r.va));
      EXPECT_CU_OK(actors_[p]->AddressFree(r.va, r.pages * G));
      pm.reservations.pop_back();
    }
    while (!pm.refs.empty()) {
      HandleRef& r = pm.refs.back();
      Note(fmtP(p) + " final release " + Hex(r.value));
      EXPECT_CU_OK(actors_[p]->Release(r.value));
      if (--r.count == 0) pm.refs.pop_back();
    }
    CollectGarbage();
  }

  std::string History() const {
    std::string out = "seed " + std::to_string(seed_) + "; last operations:\n";
    for (const std::string& h : history_) out += "  " + h + "\n";
    return out;
  }

  static std::string fmtP(int p) { return p == 0 ? "test" : "peer" + std::to_string(p); }

  uint64_t seed_ = 0;
  int steps_ = 0;
  int step_ = 0;
  int oom_ = 0;
  std::mt19937_64 rng_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  size_t free0_ = 0;
  Counts baseline_;
  std::vector<std::unique_ptr<EmuPeer>> peers_;
  std::vector<std::unique_ptr<Actor>> actors_;
  std::vector<ProcessModel> procs_;
  std::vector<Allocation> allocs_;
  std::deque<std::string> history_;
};

TEST_F(VmmProperty, RandomOperationsAcrossProcessesLeaveNoLeaks) {
  if (HasFatalFailure()) return;
  std::array<int, kOpCount> done{};
  auto start = std::chrono::steady_clock::now();
  for (step_ = 0; step_ < steps_; ++step_) {
    // An operation whose precondition fails is replaced by another draw.
    for (int tries = 0; tries < 20; ++tries) {
      Op op = PickOp();
      int p = PickProcess();
      if (Run(op, p)) {
        ++done[op];
        break;
      }
    }
    CheckCounts(0);
    CheckFreeMemory();
    if (step_ % 25 == 0) {
      for (int i = 1; i <= kPeers; ++i) CheckCounts(i);
    }
    if (HasFailure()) {
      ADD_FAILURE() << "stopped at step " << step_ << "\n" << History();
      return;
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string summary;
  for (int i = 0; i < kOpCount; ++i) {
    summary += std::string(kOpNames[i]) + "=" + std::to_string(done[i]) + " ";
  }
  std::printf("vmm property test: %d steps in %.1f s, %d out-of-memory creations: %s\n", steps_,
              seconds, oom_, summary.c_str());
  if (steps_ >= 2000) {
    // Every kind of operation ran: the sequence exercised what it claims to.
    for (int i = 0; i < kOpCount; ++i) EXPECT_GT(done[i], 0) << kOpNames[i] << " never ran";
    EXPECT_GT(oom_, 0) << "no creation ran out of memory";
  }

  // Release everything, peers first in a random order, then the test.
  std::vector<int> order;
  for (int i = 1; i <= kPeers; ++i) order.push_back(i);
  std::shuffle(order.begin(), order.end(), rng_);
  order.push_back(0);
  for (int p : order) {
    ReleaseEverything(p);
    if (HasFailure()) {
      ADD_FAILURE() << "while releasing everything\n" << History();
      return;
    }
  }
  EXPECT_EQ(UsedBytes(), 0u);
  for (int p = 0; p <= kPeers; ++p) {
    Counts got;
    ASSERT_TRUE(actors_[p]->GetCounts(&got));
    EXPECT_EQ(got.device_bytes, baseline_.device_bytes) << fmtP(p) << " sees bytes in use";
    EXPECT_EQ(got.handle_refs, p == 0 ? baseline_.handle_refs : 0) << fmtP(p);
    EXPECT_EQ(got.mappings, p == 0 ? baseline_.mappings : 0) << fmtP(p);
    EXPECT_EQ(got.physical_allocations, p == 0 ? baseline_.physical_allocations : 0) << fmtP(p);
    EXPECT_EQ(got.process_bytes, p == 0 ? baseline_.process_bytes : 0) << fmtP(p);
    EXPECT_EQ(got.reservations, p == 0 ? baseline_.reservations : 0) << fmtP(p);
  }
  for (auto& peer : peers_) {
    int status = peer->Stop();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer exit status " << status;
  }
  cuCtxSetCurrent(nullptr);
  EXPECT_CU_OK(cuDevicePrimaryCtxRelease(dev_));
  ctx_ = nullptr;
  ThawEmuDeviceStats d{};
  ASSERT_EQ(thawEmuGetDeviceStats(0, &d), CUDA_SUCCESS);
  EXPECT_EQ(d.device_bytes_in_use, 0u) << "device-wide bytes in use at the end";
  EXPECT_EQ(d.vmm_handle_refs, 0u);
  EXPECT_EQ(d.vmm_mappings, 0u);
  EXPECT_EQ(d.physical_allocations, 0u);
  EXPECT_EQ(d.capacity_bytes, 160 * kMiB);
}

}  // namespace
}  // namespace thaw_vmm_test
