// A driver client that knows nothing of thaw, run once on the driver alone and once under
// libthaw-preload.so (no thawd): every answer it gets — each CUresult, each value it reads
// back — is printed as one "name value" line, never an address, so that the two runs' outputs
// are equal exactly when the shim answered as the driver does (transparency_test.sh diffs them).
// It reaches the driver as the CUDA runtime does: dlopen + cuGetProcAddress_v2.
//
//   transparency_probe <libcuda.so.1> vmm-bounds
//       VMM calls on the edges of the caller's own reservations: a cuMemMap running past the
//       end of one, into a freed one; cuMemUnmap / cuMemSetAccess over two reservations;
//       cuMemAddressFree while mapped; a fixed-address reservation of freed VA; reservation
//       alignments; VMM calls on cuMemAlloc memory (which is not VMM memory to the driver).
//   transparency_probe <libcuda.so.1> vmm-fork
//       forks before either side touches CUDA (as NCCL's and PyTorch's workers do); the parent
//       creates POSIX-fd-shareable memory, fills it and sends the descriptor (SCM_RIGHTS); the
//       child imports it into its own reservation, reads the parent's bytes, writes its own;
//       the parent reads them back.
//   transparency_probe <libcuda.so.1> vmm-fixed-va
//       after a cuMemAlloc, a reservation at a fixed address no one has reserved (as a process
//       importing memory asks for the exporter's address): honoured, mapped, written, read;
//       then freed while cuMemAlloc goes on.
//   transparency_probe <libcuda.so.1> context-teardown
//       cuMemAlloc memory and its context: the CONTEXT and mapping attributes; the memory of
//       a created context after cuCtxDestroy, of the primary context after its last
//       cuDevicePrimaryCtxRelease (and not after an earlier one), and after
//       cuDevicePrimaryCtxReset: gone (attributes, cuMemFree, free memory) — the rest kept.
//   transparency_probe <libcuda.so.1> vmm-share [options]
//       forks first; both sides initialise; one creates POSIX-fd-shareable memory, fills it
//       and sends the descriptor, the other imports, maps, reads and writes it, the exporter
//       reads the importer's bytes — in variants the options choose (see vmm_share below).
//   transparency_probe <libcuda.so.1> capture
//       "potentially unsafe" calls during stream captures: cuMemAlloc and cuMemFree refused
//       by a GLOBAL capture (begun with the original modeless entry point, or on the
//       per-thread default stream through the _ptsz variants) and the capture invalidated;
//       allowed to a thread whose own mode is RELAXED; allowed again once the capture ended.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#undef cuGetProcAddress

namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
GetProcAddress g_gpa = nullptr;

template <typename Fn>
Fn get(const char* name, int version = 12080, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (g_gpa(name, &p, version, flags, &status) != CUDA_SUCCESS || p == nullptr) {
    std::fprintf(stderr, "no %s\n", name);
    std::exit(3);
  }
  return reinterpret_cast<Fn>(p);
}

void say(const char* side, const char* what, long long value) {
  std::printf("%s %s %lld\n", side, what, value);
}

// The entry points the scenarios use, looked up once.
struct Driver {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_retain)(CUcontext*, CUdevice);
  CUresult (*set_current)(CUcontext);
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*get_access)(unsigned long long*, const CUmemLocation*, CUdeviceptr);
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*);
  CUresult (*export_fd)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                        unsigned long long);
  CUresult (*import_fd)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType);
  CUresult (*alloc)(CUdeviceptr*, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void*, size_t);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t);
  CUresult (*memset32)(CUdeviceptr, unsigned int, size_t);
  CUresult (*synchronize)();
};

Driver load(const char* path) {
  void* handle = ::dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "%s\n", ::dlerror());
    std::exit(2);
  }
  g_gpa = reinterpret_cast<GetProcAddress>(::dlsym(handle, "cuGetProcAddress_v2"));
  if (g_gpa == nullptr) std::exit(2);
  Driver d{};
  d.init = get<decltype(d.init)>("cuInit");
  d.device_get = get<decltype(d.device_get)>("cuDeviceGet");
  d.primary_retain = get<decltype(d.primary_retain)>("cuDevicePrimaryCtxRetain");
  d.set_current = get<decltype(d.set_current)>("cuCtxSetCurrent");
  d.granularity = get<decltype(d.granularity)>("cuMemGetAllocationGranularity");
  d.reserve = get<decltype(d.reserve)>("cuMemAddressReserve");
  d.address_free = get<decltype(d.address_free)>("cuMemAddressFree");
  d.create = get<decltype(d.create)>("cuMemCreate");
  d.release = get<decltype(d.release)>("cuMemRelease");
  d.map = get<decltype(d.map)>("cuMemMap");
  d.unmap = get<decltype(d.unmap)>("cuMemUnmap");
  d.set_access = get<decltype(d.set_access)>("cuMemSetAccess");
  d.get_access = get<decltype(d.get_access)>("cuMemGetAccess");
  d.retain = get<decltype(d.retain)>("cuMemRetainAllocationHandle");
  d.export_fd = get<decltype(d.export_fd)>("cuMemExportToShareableHandle");
  d.import_fd = get<decltype(d.import_fd)>("cuMemImportFromShareableHandle");
  d.alloc = get<decltype(d.alloc)>("cuMemAlloc");
  d.free = get<decltype(d.free)>("cuMemFree");
  d.htod = get<decltype(d.htod)>("cuMemcpyHtoD");
  d.dtoh = get<decltype(d.dtoh)>("cuMemcpyDtoH");
  d.memset32 = get<decltype(d.memset32)>("cuMemsetD32");
  d.synchronize = get<decltype(d.synchronize)>("cuCtxSynchronize");
  return d;
}

CUresult init_context(const Driver& d) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = d.init(0);
  if (r == CUDA_SUCCESS) r = d.device_get(&dev, 0);
  if (r == CUDA_SUCCESS) r = d.primary_retain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = d.set_current(ctx);
  return r;
}

CUmemAllocationProp shareable_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc read_write() {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

// A call that should fail, and undone if it did not (so the next step starts from the same
// state with and without the shim); prints the call's answer and the undoing's.
void expect_refused_map(const Driver& d, const char* what, CUdeviceptr va, size_t size,
                        size_t offset, CUmemGenericAllocationHandle h) {
  const CUresult r = d.map(va, size, offset, h, 0);
  say("vmm", what, r);
  if (r == CUDA_SUCCESS) say("vmm", (std::string(what) + ".undo").c_str(), d.unmap(va, size));
}

void vmm_bounds(const Driver& d) {
  say("vmm", "init", init_context(d));
  const CUmemAllocationProp prop = shareable_prop();
  const CUmemAccessDesc rw = read_write();
  size_t g = 0;
  say("vmm", "granularity", d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  say("vmm", "granularity.value", static_cast<long long>(g));
  if (g == 0) return;

  // Two reservations of 2 granules each, one allocation of 4.
  CUdeviceptr a = 0, b = 0;
  say("vmm", "reserve.a", d.reserve(&a, 2 * g, 0, 0, 0));
  say("vmm", "reserve.b", d.reserve(&b, 2 * g, 0, 0, 0));
  say("vmm", "reserve.a.aligned", a % g == 0);
  CUmemGenericAllocationHandle h = 0;
  say("vmm", "create", d.create(&h, 4 * g, &prop, 0));

  // Past the end of a's reservation: the driver refuses.
  expect_refused_map(d, "map.past_end.whole", a, 4 * g, 0, h);
  expect_refused_map(d, "map.past_end.tail", a + g, 2 * g, 0, h);
  expect_refused_map(d, "map.past_end.wrap", a + g, ~size_t{0} / g * g, 0, h);

  // Inside: fine; then the calls over both reservations or past a's end.
  say("vmm", "map.a", d.map(a, 2 * g, 0, h, 0));
  say("vmm", "map.b", d.map(b, 2 * g, 2 * g, h, 0));
  say("vmm", "set_access.a", d.set_access(a, 2 * g, &rw, 1));
  say("vmm", "set_access.past_end", d.set_access(a + g, 2 * g, &rw, 1));
  say("vmm", "set_access.past_end.bad_device", [&] {
    CUmemAccessDesc bad = rw;
    bad.location.id = 99;
    return d.set_access(a + g, 2 * g, &bad, 1);
  }());
  say("vmm", "unmap.past_end", d.unmap(a, 3 * g));
  say("vmm", "unmap.past_end.zero", d.unmap(a + 2 * g, 0));
  say("vmm", "address_free.while_mapped", d.address_free(a, 2 * g));
  say("vmm", "memset.a", d.memset32(a, 0x5a5a5a5a, 2 * g / 4));
  say("vmm", "sync", d.synchronize());
  unsigned int word = 0;
  say("vmm", "read.a", d.dtoh(&word, a + 2 * g - 4, 4));
  say("vmm", "read.a.value", word);
  unsigned long long flags = 0;
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  say("vmm", "get_access.a", d.get_access(&flags, &loc, a));
  say("vmm", "get_access.a.flags", static_cast<long long>(flags));
  say("vmm", "unmap.a", d.unmap(a, 2 * g));
  say("vmm", "unmap.b", d.unmap(b, 2 * g));
  say("vmm", "address_free.b.wrong_size", d.address_free(b, g));
  say("vmm", "address_free.b.inside", d.address_free(b + g, g));

  // A reservation freed: its VA is nobody's any more.
  say("vmm", "address_free.a", d.address_free(a, 2 * g));
  expect_refused_map(d, "map.freed", a, 2 * g, 0, h);
  say("vmm", "unmap.freed", d.unmap(a, 2 * g));
  say("vmm", "set_access.freed", d.set_access(a, 2 * g, &rw, 1));
  say("vmm", "address_free.a.again", d.address_free(a, 2 * g));
  // The freed VA asked for by address: the driver gives it back where it is free.
  CUdeviceptr again = 0;
  say("vmm", "reserve.at_freed", d.reserve(&again, 2 * g, 0, a, 0));
  say("vmm", "reserve.at_freed.same", again == a);
  if (again != 0) {
    say("vmm", "map.at_freed", d.map(again, 2 * g, 0, h, 0));
    say("vmm", "unmap.at_freed", d.unmap(again, 2 * g));
    say("vmm", "address_free.at_freed", d.address_free(again, 2 * g));
  }
  say("vmm", "address_free.b", d.address_free(b, 2 * g));

  // Reservation parameters the driver checks itself.
  CUdeviceptr c = 0;
  say("vmm", "reserve.align_not_pow2", d.reserve(&c, 2 * g, 3 * g, 0, 0));
  if (c != 0) (void)d.address_free(c, 2 * g);
  c = 0;
  say("vmm", "reserve.align_4g", d.reserve(&c, 2 * g, 4 * g, 0, 0));
  say("vmm", "reserve.align_4g.aligned", c % (4 * g) == 0);
  if (c != 0) say("vmm", "address_free.align_4g", d.address_free(c, 2 * g));

  // cuMemAlloc memory is not VMM memory to the driver: no VMM call accepts it.
  CUdeviceptr p = 0;
  say("legacy", "alloc", d.alloc(&p, 1 << 20));
  say("legacy", "unmap", d.unmap(p, g));
  say("legacy", "set_access", d.set_access(p, g, &rw, 1));
  say("legacy", "get_access", d.get_access(&flags, &loc, p));
  CUmemGenericAllocationHandle got = 0;
  const CUresult retained = d.retain(&got, reinterpret_cast<void*>(p));
  say("legacy", "retain", retained);
  if (retained == CUDA_SUCCESS) say("legacy", "retain.release", d.release(got));
  expect_refused_map(d, "legacy.map", p, g, 0, h);
  say("legacy", "address_free", d.address_free(p, g));
  say("legacy", "free", d.free(p));

  say("vmm", "release", d.release(h));
}

bool send_fd(int sock, int fd) {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &msg, 0) == 1;
}

int recv_fd(int sock) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(sock, &msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

constexpr unsigned kParentWord = 0x11111111u;
constexpr unsigned kChildWord = 0x22222222u;

// Reads the first and the last word of [va, va + size) and prints them.
void read_back(const Driver& d, const char* side, const char* what, CUdeviceptr va, size_t size) {
  unsigned first = 0, last = 0;
  const CUresult r1 = d.dtoh(&first, va, 4), r2 = d.dtoh(&last, va + size - 4, 4);
  say(side, (std::string(what) + ".read").c_str(), r1 != CUDA_SUCCESS ? r1 : r2);
  say(side, (std::string(what) + ".first").c_str(), first);
  say(side, (std::string(what) + ".last").c_str(), last);
}

int fork_importer(const Driver& d, int sock) {
  const int fd = recv_fd(sock);
  say("importer", "received", fd >= 0);
  say("importer", "init", init_context(d));
  size_t g = 0;
  const CUmemAllocationProp prop = shareable_prop();
  (void)d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  const size_t size = 2 * g;
  CUmemGenericAllocationHandle h = 0;
  say("importer", "import",
      d.import_fd(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ::close(fd);
  CUdeviceptr va = 0;
  say("importer", "reserve", d.reserve(&va, size, 0, 0, 0));
  say("importer", "map", d.map(va, size, 0, h, 0));
  const CUmemAccessDesc rw = read_write();
  say("importer", "set_access", d.set_access(va, size, &rw, 1));
  read_back(d, "importer", "parent_bytes", va, size);
  std::vector<unsigned> words(size / 4, kChildWord);
  say("importer", "write", d.htod(va, words.data(), size));
  say("importer", "sync", d.synchronize());
  say("importer", "unmap", d.unmap(va, size));
  say("importer", "address_free", d.address_free(va, size));
  say("importer", "release", d.release(h));
  std::fflush(stdout);
  char done = 'd';
  return ::write(sock, &done, 1) == 1 ? 0 : 5;
}

int vmm_fork(const Driver& d) {
  int socks[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, socks) != 0) return 2;
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(socks[0]);
    ::_exit(fork_importer(d, socks[1]));  // _exit: the parent's stdio buffers are not ours
  }
  ::close(socks[1]);
  say("exporter", "init", init_context(d));
  size_t g = 0;
  const CUmemAllocationProp prop = shareable_prop();
  say("exporter", "granularity", d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = 2 * g;
  // A cuMemAlloc first, as an engine has made many by the time NCCL sets up its buffers.
  CUdeviceptr first = 0;
  say("exporter", "alloc", d.alloc(&first, 4096));
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  say("exporter", "reserve", d.reserve(&va, size, 0, 0, 0));
  say("exporter", "create", d.create(&h, size, &prop, 0));
  say("exporter", "map", d.map(va, size, 0, h, 0));
  const CUmemAccessDesc rw = read_write();
  say("exporter", "set_access", d.set_access(va, size, &rw, 1));
  say("exporter", "fill", d.memset32(va, kParentWord, size / 4));
  say("exporter", "sync", d.synchronize());
  int fd = -1;
  say("exporter", "export", d.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  const bool sent = fd >= 0 && send_fd(socks[0], fd);
  if (fd >= 0) ::close(fd);
  char done = 0;
  const bool heard = sent && ::read(socks[0], &done, 1) == 1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::fflush(stdout);  // the child's lines come first
  say("exporter", "child_done", heard);
  say("exporter", "child_exit", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  read_back(d, "exporter", "child_bytes", va, size);
  say("exporter", "unmap", d.unmap(va, size));
  say("exporter", "address_free", d.address_free(va, size));
  say("exporter", "release", d.release(h));
  say("exporter", "free", d.free(first));
  return 0;
}

// --- vmm-share ---

// A first client of POSIX-fd VMM sharing written from the driver documentation: fork first,
// then both sides initialise; one exports, the other imports, maps, writes; the exporter reads.
// Options (argv[3...]):
//   child-exports        the child exports, the parent imports (default: the other way)
//   alloc-first          the exporter makes a cuMemAlloc first
//   importer-alloc       the importer makes a cuMemAlloc first
//   importer-freed=N     the importer allocates N granules and frees them first
//   importer-fixed       the importer reserves at the exporter's address
//   importer-staging     the importer makes a cuMemAlloc between its reserve and its map
//   recommended          RECOMMENDED granularity (default MINIMUM)
//   granules=N count=N   each allocation's size in granules; how many are shared
//   import-offset        the importer maps one granule into its reservation
//   remap                the exporter unmaps and maps its memory again before reading
//   write=memset8|memset32|memset32-async|htod|htod-async|dtod|dtod-async
//   read=dtoh|dtoh-async (async ones on a non-blocking stream)
struct ShareOptions {
  bool child_exports = false;
  bool alloc_first = false;
  bool importer_alloc = false;
  bool recommended = false;
  size_t granules = 2;
  int count = 1;
  bool import_offset = false;
  bool remap = false;
  std::string write = "htod";
  std::string read = "dtoh";
  bool importer_fixed = false;    // the importer reserves at the exporter's address
  size_t importer_freed = 0;      // granules the importer allocates and frees first
  bool importer_staging = false;  // a cuMemAlloc between the importer's reserve and map
};

struct ShareCalls {
  CUresult (*memset8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*memset32_async)(CUdeviceptr, unsigned int, size_t, CUstream);
  CUresult (*htod_async)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*dtoh_async)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*stream_create)(CUstream*, unsigned);
  CUresult (*stream_sync)(CUstream);
  CUresult (*stream_destroy)(CUstream);
};

ShareCalls share_calls() {
  ShareCalls c{};
  c.memset8 = get<decltype(c.memset8)>("cuMemsetD8");
  c.memset32_async = get<decltype(c.memset32_async)>("cuMemsetD32Async");
  c.htod_async = get<decltype(c.htod_async)>("cuMemcpyHtoDAsync");
  c.dtoh_async = get<decltype(c.dtoh_async)>("cuMemcpyDtoHAsync");
  c.dtod = get<decltype(c.dtod)>("cuMemcpyDtoD");
  c.dtod_async = get<decltype(c.dtod_async)>("cuMemcpyDtoDAsync");
  c.stream_create = get<decltype(c.stream_create)>("cuStreamCreate");
  c.stream_sync = get<decltype(c.stream_sync)>("cuStreamSynchronize");
  c.stream_destroy = get<decltype(c.stream_destroy)>("cuStreamDestroy");
  return c;
}

size_t share_granularity(const Driver& d, const ShareOptions& o) {
  size_t g = 0;
  const CUmemAllocationProp prop = shareable_prop();
  (void)d.granularity(
      &g, &prop,
      o.recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED : CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  return g;
}

// Reads words at the start, middle and end of [va, va + size) with the chosen method.
void share_read(const Driver& d, const ShareCalls& c, const ShareOptions& o, const char* side,
                const std::string& what, CUdeviceptr va, size_t size) {
  const size_t at[3] = {0, size / 2, size - 4};
  const char* names[3] = {".first", ".mid", ".last"};
  CUstream s = nullptr;
  if (o.read == "dtoh-async") say(side, (what + ".stream").c_str(), c.stream_create(&s, 1));
  for (int i = 0; i < 3; ++i) {
    unsigned word = 0xdeadbeef;
    CUresult r;
    if (o.read == "dtoh-async") {
      r = c.dtoh_async(&word, va + at[i], 4, s);
      if (r == CUDA_SUCCESS) r = c.stream_sync(s);
    } else {
      r = d.dtoh(&word, va + at[i], 4);
    }
    say(side, (what + names[i] + ".read").c_str(), r);
    say(side, (what + names[i]).c_str(), word);
  }
  if (s != nullptr) (void)c.stream_destroy(s);
}

CUresult share_write(const Driver& d, const ShareCalls& c, const ShareOptions& o, CUdeviceptr va,
                     size_t size, unsigned word) {
  CUstream s = nullptr;
  CUresult r = CUDA_SUCCESS;
  const bool async = o.write.find("async") != std::string::npos;
  if (async && (r = c.stream_create(&s, 1)) != CUDA_SUCCESS) return r;
  std::vector<unsigned> words(size / 4, word);
  CUdeviceptr tmp = 0;
  if (o.write == "memset8") {
    r = c.memset8(va, static_cast<unsigned char>(word), size);
  } else if (o.write == "memset32") {
    r = d.memset32(va, word, size / 4);
  } else if (o.write == "memset32-async") {
    r = c.memset32_async(va, word, size / 4, s);
  } else if (o.write == "htod") {
    r = d.htod(va, words.data(), size);
  } else if (o.write == "htod-async") {
    r = c.htod_async(va, words.data(), size, s);
  } else if (o.write == "dtod" || o.write == "dtod-async") {
    r = d.alloc(&tmp, size);
    if (r == CUDA_SUCCESS) r = d.htod(tmp, words.data(), size);
    if (r == CUDA_SUCCESS) r = async ? c.dtod_async(va, tmp, size, s) : c.dtod(va, tmp, size);
  } else {
    std::fprintf(stderr, "unknown write %s\n", o.write.c_str());
    std::exit(2);
  }
  if (r == CUDA_SUCCESS && async) r = c.stream_sync(s);
  if (r == CUDA_SUCCESS) r = d.synchronize();
  if (tmp != 0) (void)d.free(tmp);
  if (s != nullptr) (void)c.stream_destroy(s);
  return r;
}

constexpr unsigned kExporterFill = 0x11111111u;
constexpr unsigned kImporterFill = 0x22222222u;

int share_importer(const Driver& d, const ShareCalls& c, const ShareOptions& o, int sock) {
  std::vector<int> fds;
  for (int i = 0; i < o.count; ++i) fds.push_back(recv_fd(sock));
  say("importer", "received", fds.back() >= 0);
  CUdeviceptr exporter_va = 0;
  say("importer", "received.va", ::read(sock, &exporter_va, sizeof exporter_va));
  say("importer", "init", init_context(d));
  const size_t g = share_granularity(d, o);
  const size_t size = g * o.granules;
  CUdeviceptr mine = 0;
  if (o.importer_alloc) say("importer", "alloc", d.alloc(&mine, 4096));
  if (o.importer_freed != 0) {
    CUdeviceptr freed = 0;
    say("importer", "alloc.freed", d.alloc(&freed, o.importer_freed * g));
    say("importer", "free.freed", d.free(freed));
  }
  const size_t lead = o.import_offset ? g : 0;
  const CUmemAccessDesc rw = read_write();
  std::vector<CUmemGenericAllocationHandle> handles(o.count, 0);
  CUdeviceptr va = 0;
  const size_t total = lead + size * o.count;
  say("importer", "reserve",
      d.reserve(&va, total, 0, o.importer_fixed ? exporter_va - lead : 0, 0));
  if (o.importer_fixed) say("importer", "reserve.where_asked", va == exporter_va - lead);
  CUdeviceptr staging = 0;
  if (o.importer_staging) say("importer", "alloc.staging", d.alloc(&staging, 2 * size));
  for (int i = 0; i < o.count; ++i) {
    const std::string n = "[" + std::to_string(i) + "]";
    say("importer", ("import" + n).c_str(),
        d.import_fd(&handles[i], reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i])),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ::close(fds[i]);
    const CUdeviceptr at = va + lead + i * size;
    say("importer", ("map" + n).c_str(), d.map(at, size, 0, handles[i], 0));
    say("importer", ("set_access" + n).c_str(), d.set_access(at, size, &rw, 1));
    share_read(d, c, o, "importer", "exporter_bytes" + n, at, size);
    say("importer", ("write" + n).c_str(),
        share_write(d, c, o, at, size, kImporterFill + static_cast<unsigned>(i)));
    share_read(d, c, o, "importer", "own_bytes" + n, at, size);
  }
  for (int i = 0; i < o.count; ++i) {
    const std::string n = "[" + std::to_string(i) + "]";
    say("importer", ("unmap" + n).c_str(), d.unmap(va + lead + i * size, size));
    say("importer", ("release" + n).c_str(), d.release(handles[i]));
  }
  say("importer", "address_free", d.address_free(va, total));
  if (staging != 0) say("importer", "free.staging", d.free(staging));
  if (mine != 0) say("importer", "free", d.free(mine));
  std::fflush(stdout);
  char done = 'd';
  return ::write(sock, &done, 1) == 1 ? 0 : 5;
}

int vmm_share(const Driver& d, const std::vector<std::string>& args) {
  ShareOptions o;
  for (const std::string& a : args) {
    if (a == "child-exports")
      o.child_exports = true;
    else if (a == "alloc-first")
      o.alloc_first = true;
    else if (a == "importer-alloc")
      o.importer_alloc = true;
    else if (a == "recommended")
      o.recommended = true;
    else if (a == "import-offset")
      o.import_offset = true;
    else if (a == "remap")
      o.remap = true;
    else if (a.rfind("granules=", 0) == 0)
      o.granules = std::stoul(a.substr(9));
    else if (a.rfind("count=", 0) == 0)
      o.count = std::stoi(a.substr(6));
    else if (a.rfind("write=", 0) == 0)
      o.write = a.substr(6);
    else if (a.rfind("read=", 0) == 0)
      o.read = a.substr(5);
    else if (a == "importer-fixed")
      o.importer_fixed = true;
    else if (a == "importer-staging")
      o.importer_staging = true;
    else if (a.rfind("importer-freed=", 0) == 0)
      o.importer_freed = std::stoul(a.substr(15));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  // One flush per process at known points, so the two processes' lines never interleave.
  static char buffer[1 << 20];
  std::setvbuf(stdout, buffer, _IOFBF, sizeof buffer);
  int socks[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, socks) != 0) return 2;
  const pid_t pid = ::fork();
  if (pid < 0) return 2;
  const bool exporter = (pid == 0) == o.child_exports;
  const int sock = pid == 0 ? socks[1] : socks[0];
  ::close(pid == 0 ? socks[0] : socks[1]);
  const ShareCalls c = share_calls();
  if (!exporter) {
    const int rc = share_importer(d, c, o, sock);
    if (pid == 0) ::_exit(rc);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return rc;
  }
  // The exporter: shares, waits for the importer, then reads.
  CUdeviceptr va = 0;
  const int rc = [&] {
    say("exporter", "init", init_context(d));
    const size_t g = share_granularity(d, o);
    const size_t size = g * o.granules;
    const CUmemAllocationProp prop = shareable_prop();
    const CUmemAccessDesc rw = read_write();
    CUdeviceptr first = 0;
    if (o.alloc_first) say("exporter", "alloc", d.alloc(&first, 4096));
    std::vector<CUmemGenericAllocationHandle> handles(o.count, 0);
    say("exporter", "reserve", d.reserve(&va, size * o.count, 0, 0, 0));
    for (int i = 0; i < o.count; ++i) {
      const std::string n = "[" + std::to_string(i) + "]";
      const CUdeviceptr at = va + i * size;
      say("exporter", ("create" + n).c_str(), d.create(&handles[i], size, &prop, 0));
      say("exporter", ("map" + n).c_str(), d.map(at, size, 0, handles[i], 0));
      say("exporter", ("set_access" + n).c_str(), d.set_access(at, size, &rw, 1));
      say("exporter", ("fill" + n).c_str(),
          d.memset32(at, kExporterFill + static_cast<unsigned>(i), size / 4));
    }
    say("exporter", "sync", d.synchronize());
    bool sent = true;
    for (int i = 0; i < o.count; ++i) {
      int fd = -1;
      say("exporter", "export",
          d.export_fd(&fd, handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      sent = sent && fd >= 0 && send_fd(sock, fd);
      if (fd >= 0) ::close(fd);
    }
    sent = sent && ::write(sock, &va, sizeof va) == sizeof va;
    char done = 0;
    const bool heard = sent && ::read(sock, &done, 1) == 1;
    if (pid != 0) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      std::fflush(stdout);  // the child's lines come first
      say("exporter", "child_exit",
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    say("exporter", "heard", heard);
    for (int i = 0; i < o.count; ++i) {
      const std::string n = "[" + std::to_string(i) + "]";
      const CUdeviceptr at = va + i * size;
      if (o.remap) {
        say("exporter", ("remap.unmap" + n).c_str(), d.unmap(at, size));
        say("exporter", ("remap.map" + n).c_str(), d.map(at, size, 0, handles[i], 0));
        say("exporter", ("remap.set_access" + n).c_str(), d.set_access(at, size, &rw, 1));
      }
      share_read(d, c, o, "exporter", "importer_bytes" + n, at, size);
    }
    for (int i = 0; i < o.count; ++i) {
      const std::string n = "[" + std::to_string(i) + "]";
      say("exporter", ("unmap" + n).c_str(), d.unmap(va + i * size, size));
      say("exporter", ("release" + n).c_str(), d.release(handles[i]));
    }
    say("exporter", "address_free", d.address_free(va, size * o.count));
    if (first != 0) say("exporter", "free", d.free(first));
    return 0;
  }();
  std::fflush(stdout);
  if (pid == 0) {
    char done = 'd';
    (void)::write(sock, &done, 1);
    ::_exit(rc);
  }
  return rc;
}

// --- vmm-fixed-va ---

// Inside the shim's default region (THAW_PRELOAD_VA_BASE 0x200000000000, 4 x the 1 GiB
// device the test gives the emulator), ahead of the first allocations and in the way of the
// later ones (the layout then stops, and the driver places them); free VA to the
// driver alone.
constexpr CUdeviceptr kFixedVa = 0x200000000000ull + (256ull << 20);

int vmm_fixed_va(const Driver& d) {
  say("fixed", "init", init_context(d));
  size_t g = 0;
  const CUmemAllocationProp prop = shareable_prop();
  say("fixed", "granularity", d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUdeviceptr first = 0;
  say("fixed", "alloc", d.alloc(&first, 4096));
  CUdeviceptr va = 0;
  say("fixed", "reserve", d.reserve(&va, 2 * g, 0, kFixedVa, 0));
  say("fixed", "reserve.where_asked", va == kFixedVa);
  CUmemGenericAllocationHandle h = 0;
  say("fixed", "create", d.create(&h, 2 * g, &prop, 0));
  say("fixed", "map", d.map(va, 2 * g, 0, h, 0));
  const CUmemAccessDesc rw = read_write();
  say("fixed", "set_access", d.set_access(va, 2 * g, &rw, 1));
  say("fixed", "fill", d.memset32(va, kParentWord, 2 * g / 4));
  say("fixed", "sync", d.synchronize());
  read_back(d, "fixed", "bytes", va, 2 * g);
  // Allocations go on around it.
  std::vector<CUdeviceptr> more(8, 0);
  for (CUdeviceptr& p : more) say("fixed", "alloc.more", d.alloc(&p, 100 << 20));
  read_back(d, "fixed", "bytes.after", va, 2 * g);
  for (CUdeviceptr p : more) say("fixed", "free.more", d.free(p));
  say("fixed", "unmap", d.unmap(va, 2 * g));
  say("fixed", "address_free", d.address_free(va, 2 * g));
  say("fixed", "release", d.release(h));
  say("fixed", "free", d.free(first));
  return 0;
}

// --- context-teardown ---

bool known(CUresult (*attribute)(void*, CUpointer_attribute, CUdeviceptr), CUdeviceptr p) {
  unsigned type = 0;
  return attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS;
}

int context_teardown(const Driver& d) {
  auto attribute =
      get<CUresult (*)(void*, CUpointer_attribute, CUdeviceptr)>("cuPointerGetAttribute");
  auto mem_info = get<CUresult (*)(size_t*, size_t*)>("cuMemGetInfo");
  auto ctx_create = get<CUresult (*)(CUcontext*, unsigned, CUdevice)>("cuCtxCreate", 11000);
  auto ctx_destroy = get<CUresult (*)(CUcontext)>("cuCtxDestroy");
  auto primary_release = get<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxRelease");
  auto primary_reset = get<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxReset");
  // The original (v1) release and reset, as code built against CUDA 10 finds them.
  auto primary_release_v1 = get<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxRelease", 10000);
  auto primary_reset_v1 = get<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxReset", 10000);
  say("ctx", "init", init_context(d));
  CUcontext primary = nullptr;
  say("ctx", "retain", d.primary_retain(&primary, 0));  // held twice now
  auto free_bytes = [&] {
    size_t free = 0, total = 0;
    return mem_info(&free, &total) == CUDA_SUCCESS ? free : 0;
  };
  const size_t free0 = free_bytes();

  CUdeviceptr p = 0;
  say("ctx", "alloc.primary", d.alloc(&p, 3 << 20));
  CUcontext owner = nullptr;
  say("ctx", "attr.context", attribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p + 100));
  say("ctx", "attr.context.primary", owner == primary);
  void* mapping = nullptr;
  say("ctx", "attr.mapping_base",
      attribute(&mapping, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p + 100));
  say("ctx", "attr.mapping_base.is_alloc", mapping == reinterpret_cast<void*>(p));
  size_t mapping_size = 0;
  say("ctx", "attr.mapping_size", attribute(&mapping_size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p));
  say("ctx", "attr.mapping_size.value", static_cast<long long>(mapping_size));

  // A created context: its memory goes with it, the primary's stays.
  CUcontext created = nullptr;
  say("ctx", "create", ctx_create(&created, 0, 0));
  const size_t free1 = free_bytes();
  CUdeviceptr q = 0, q2 = 0;
  say("ctx", "alloc.created", d.alloc(&q, 5 << 20));
  say("ctx", "alloc.created.2", d.alloc(&q2, 4096));
  say("ctx", "attr.context.created",
      attribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, q) == CUDA_SUCCESS && owner == created);
  say("ctx", "destroy", ctx_destroy(created));
  say("ctx", "created.known", known(attribute, q));
  say("ctx", "created.2.known", known(attribute, q2));
  say("ctx", "created.free", d.free(q));
  say("ctx", "primary.known", known(attribute, p));
  say("ctx", "free_memory.after_destroy", free_bytes() == free1);
  say("ctx", "destroy.again", ctx_destroy(created));

  // An earlier release keeps the primary context (and its memory); the last one frees it.
  say("ctx", "release.1", primary_release(0));
  say("ctx", "release.1.known", known(attribute, p));
  say("ctx", "release.2", primary_release_v1(0));
  say("ctx", "retain.again", d.primary_retain(&primary, 0));
  say("ctx", "set_current", d.set_current(primary));
  say("ctx", "release.2.known", known(attribute, p));
  say("ctx", "release.2.free", d.free(p));
  say("ctx", "free_memory.after_release", free_bytes() == free0);

  // A reset frees everything, the context stays retained.
  CUdeviceptr r = 0, r2 = 0;
  say("ctx", "alloc.before_reset", d.alloc(&r, 2 << 20));
  say("ctx", "reset", primary_reset(0));
  say("ctx", "reset.known", known(attribute, r));
  say("ctx", "set_current.after_reset", d.set_current(primary));
  say("ctx", "alloc.after_reset", d.alloc(&r2, 2 << 20));
  say("ctx", "reset.v1", primary_reset_v1(0));
  say("ctx", "reset.v1.known", known(attribute, r2));
  say("ctx", "reset.free", d.free(r));
  say("ctx", "free_memory.after_reset", free_bytes() == free0);
  // An inactive primary context: releasing it is refused, resetting it frees nothing.
  say("ctx", "release.last", primary_release(0));
  say("ctx", "release.inactive", primary_release(0));
  say("ctx", "reset.inactive", primary_reset(0));
  return 0;
}

// --- capture ---

int capture(const Driver& d) {
  using Begin = CUresult (*)(CUstream, CUstreamCaptureMode);
  using BeginV1 = CUresult (*)(CUstream);
  using End = CUresult (*)(CUstream, CUgraph*);
  using Exchange = CUresult (*)(CUstreamCaptureMode*);
  using IsCapturing = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  auto begin = get<Begin>("cuStreamBeginCapture");
  auto begin_v1 = get<BeginV1>("cuStreamBeginCapture", 10000);
  auto end = get<End>("cuStreamEndCapture");
  const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  auto begin_ptsz = get<Begin>("cuStreamBeginCapture", 12080, ptds);
  auto end_ptsz = get<End>("cuStreamEndCapture", 12080, ptds);
  auto is_capturing_ptsz = get<IsCapturing>("cuStreamIsCapturing", 12080, ptds);
  auto exchange = get<Exchange>("cuThreadExchangeStreamCaptureMode");
  auto is_capturing = get<IsCapturing>("cuStreamIsCapturing");
  auto stream_create = get<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate");
  auto stream_destroy = get<CUresult (*)(CUstream)>("cuStreamDestroy");
  auto graph_destroy = get<CUresult (*)(CUgraph)>("cuGraphDestroy");
  say("capture", "init", init_context(d));
  CUstream s = nullptr;
  say("capture", "stream", stream_create(&s, CU_STREAM_NON_BLOCKING));
  auto status = [&](CUstream on, IsCapturing query) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUresult r = query(on, &st);
    return r == CUDA_SUCCESS ? static_cast<long long>(st) : -static_cast<long long>(r);
  };
  auto finish = [&](const char* what, CUstream on, End end_fn) {
    CUgraph g = nullptr;
    say("capture", what, end_fn(on, &g));
    if (g != nullptr) (void)graph_destroy(g);
  };
  CUdeviceptr kept = 0, p = 0;
  say("capture", "alloc.before", d.alloc(&kept, 4096));

  // The original entry point: a GLOBAL capture.
  say("capture", "v1.begin", begin_v1(s));
  say("capture", "v1.alloc", d.alloc(&p, 4096));
  say("capture", "v1.alloc.untouched", p == 0);
  say("capture", "v1.status", status(s, is_capturing));
  finish("v1.end", s, end);
  say("capture", "v1.alloc.after", d.alloc(&p, 4096));
  say("capture", "v1.free.after", d.free(p));

  // cuMemFree of cuMemAlloc memory during a GLOBAL capture.
  say("capture", "free.begin", begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  say("capture", "free", d.free(kept));
  say("capture", "free.status", status(s, is_capturing));
  finish("free.end", s, end);
  say("capture", "free.known", [&] {
    CUdeviceptr base = 0;
    auto range = get<CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr)>("cuMemGetAddressRange");
    return range(&base, nullptr, kept) == CUDA_SUCCESS;
  }());

  // A thread whose own mode is RELAXED allocates and frees during a GLOBAL capture.
  say("capture", "relaxed.begin", begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  say("capture", "relaxed.exchange", exchange(&mode));
  p = 0;
  say("capture", "relaxed.alloc", d.alloc(&p, 1 << 20));
  say("capture", "relaxed.free", d.free(p));
  say("capture", "relaxed.restore", exchange(&mode));
  say("capture", "relaxed.status", status(s, is_capturing));
  finish("relaxed.end", s, end);

  // The per-thread default stream, through the _ptsz variants (stream 0).
  say("capture", "ptsz.begin", begin_ptsz(nullptr, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  p = 0;
  say("capture", "ptsz.alloc", d.alloc(&p, 4096));
  say("capture", "ptsz.status", status(nullptr, is_capturing_ptsz));
  finish("ptsz.end", nullptr, end_ptsz);
  say("capture", "ptsz.alloc.after", d.alloc(&p, 4096));
  say("capture", "ptsz.free.after", d.free(p));

  // A capture ended from another state than it began in: ended twice, the second refused.
  finish("end.again", s, end);
  say("capture", "free.kept", d.free(kept));
  say("capture", "stream_destroy", stream_destroy(s));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[2]) == "vmm-share") {
    const Driver d = load(argv[1]);
    return vmm_share(d, std::vector<std::string>(argv + 3, argv + argc));
  }
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: transparency_probe <libcuda.so.1> "
                 "vmm-bounds|vmm-fork|vmm-fixed-va|context-teardown|capture|"
                 "vmm-share [options]\n");
    return 2;
  }
  const Driver d = load(argv[1]);
  const std::string scenario = argv[2];
  if (scenario == "vmm-bounds") {
    vmm_bounds(d);
    return 0;
  }
  if (scenario == "vmm-fork") return vmm_fork(d);
  if (scenario == "vmm-fixed-va") return vmm_fixed_va(d);
  if (scenario == "context-teardown") return context_teardown(d);
  if (scenario == "capture") return capture(d);
  std::fprintf(stderr, "unknown scenario %s\n", argv[2]);
  return 2;
}
