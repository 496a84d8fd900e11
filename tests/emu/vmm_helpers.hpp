// Helpers shared by the VMM suites (vmm_test, vmm_ipc_test, vmm_property_test) and by the
// helper process emu_peer.
//
// The first part has no GoogleTest dependency, so emu_peer can include it: the wire
// protocol between a test and its peers, a byte pattern both sides can compute, and
// EmuPeer, the test's end of a peer process. The second part (compiled only when
// <gtest/gtest.h> was included before this header) has the assertion macros and the
// fixture the suites share.
//
// Peer protocol: a SOCK_SEQPACKET socket pair, one message per command. A request is one
// line of text, "verb arg ...", numbers in decimal or 0x-hex, optionally with one file
// descriptor attached (SCM_RIGHTS). A reply is "OK [value ...]" or "ERR <CUresult> <name>"
// (a driver call failed; the peer state is unchanged) or "BAD <text>" (the request itself
// was malformed), optionally with one descriptor attached. emu_peer.cpp lists the verbs.
#ifndef THAW_TESTS_EMU_VMM_HELPERS_HPP
#define THAW_TESTS_EMU_VMM_HELPERS_HPP

#include <cuda.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "on_emulator.hpp"
#include "thaw/emu_inspect.h"

extern char** environ;

namespace thaw_vmm_test {

inline constexpr size_t kMiB = size_t{1} << 20;
// The emulator's minimum and recommended VMM granularity (design fact; a test checks it).
inline constexpr size_t kGranularity = 2 * kMiB;
inline constexpr size_t kMaxMessage = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Names and byte patterns
// ---------------------------------------------------------------------------------------

inline std::string CuName(CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return "CUresult(" + std::to_string(static_cast<int>(r)) + ")";
}

// A byte pattern that differs between seeds and between nearby offsets, so that data
// read from the wrong page, the wrong offset or the wrong allocation does not match.
inline uint8_t PatternByte(uint64_t seed, uint64_t offset) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + offset * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

inline void FillPattern(void* dst, size_t len, uint64_t seed, uint64_t first_offset = 0) {
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < len; ++i) p[i] = PatternByte(seed, first_offset + i);
}

// Index of the first byte that differs from the pattern, or -1 when all match.
inline long long FirstPatternMismatch(const void* src, size_t len, uint64_t seed,
                                      uint64_t first_offset = 0) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < len; ++i) {
    if (p[i] != PatternByte(seed, first_offset + i)) return static_cast<long long>(i);
  }
  return -1;
}

inline std::string ToHex(const void* data, size_t len) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve(len * 2);
  for (size_t i = 0; i < len; ++i) {
    out.push_back(kDigits[p[i] >> 4]);
    out.push_back(kDigits[p[i] & 15]);
  }
  return out;
}

inline bool FromHex(std::string_view hex, std::vector<uint8_t>* out) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->clear();
  out->reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]);
    int lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  return true;
}

inline std::vector<std::string> SplitWords(std::string_view line) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) words.emplace_back(line.substr(start, i - start));
  }
  return words;
}

inline bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

inline std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Cmd("map", va, size, 0, h) == "map <va> <size> 0 <h>": builds a peer command line.
inline void AppendWord(std::string* out, const std::string& w) {
  *out += " " + w;
}
inline void AppendWord(std::string* out, const char* w) {
  *out += std::string(" ") + w;
}
template <typename T>
inline void AppendWord(std::string* out, T v) {
  *out += " " + std::to_string(static_cast<unsigned long long>(v));
}
template <typename... Args>
inline std::string Cmd(const char* verb, Args... args) {
  std::string out = verb;
  (AppendWord(&out, args), ...);
  return out;
}

// ---------------------------------------------------------------------------------------
// One message (text + optional fd) over a SOCK_SEQPACKET socket
// ---------------------------------------------------------------------------------------

inline bool SendMessage(int sock, const std::string& text, int fd = -1) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(text.size());
}

enum class RecvStatus { kOk, kClosed, kTimeout, kError };

// Receives one message; *fd is the attached descriptor (close-on-exec) or -1.
// timeout_ms < 0 waits forever.
inline RecvStatus ReceiveMessage(int sock, std::string* text, int* fd, int timeout_ms) {
  *fd = -1;
  text->clear();
  if (timeout_ms >= 0) {
    pollfd p{sock, POLLIN, 0};
    int r;
    do {
      r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return RecvStatus::kTimeout;
    if (r < 0) return RecvStatus::kError;
  }
  std::string buf(kMaxMessage, '\0');
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return RecvStatus::kError;
  if (n == 0) return RecvStatus::kClosed;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd < 0) {
        *fd = got;
      } else {
        close(got);  // the protocol carries at most one descriptor
      }
    }
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) return RecvStatus::kError;
  text->assign(buf.data(), static_cast<size_t>(n));
  return RecvStatus::kOk;
}

// ---------------------------------------------------------------------------------------
// EmuPeer: a child process running emu_peer, driven over a socket pair
// ---------------------------------------------------------------------------------------

struct PeerReply {
  bool ok = false;                  // "OK ..."
  CUresult code = CUDA_SUCCESS;     // for "ERR <code>"; CUDA_ERROR_UNKNOWN for transport errors
  std::vector<std::string> values;  // the words after OK
  std::string line;                 // the whole reply (or a description of the failure)
  int fd = -1;                      // attached descriptor, owned by the receiver

  uint64_t U64(size_t i) const {
    uint64_t v = 0;
    if (i < values.size()) ParseU64(values[i], &v);
    return v;
  }
};

class EmuPeer {
 public:
  EmuPeer() = default;
  EmuPeer(const EmuPeer&) = delete;
  EmuPeer& operator=(const EmuPeer&) = delete;
  ~EmuPeer() { Stop(); }

  // Path of the emu_peer binary, from THAW_EMU_PEER (set by tests/emu/CMakeLists.txt).
  static const char* Path() { return std::getenv("THAW_EMU_PEER"); }

  // Spawns the peer with posix_spawn; its end of the socket pair is passed by number
  // ("emu_peer --sock N"). It inherits the environment (THAW_EMU_STATE_DIR: same device).
  bool Start(std::string* error) {
    const char* path = Path();
    if (path == nullptr || *path == '\0') {
      *error = "THAW_EMU_PEER is not set";
      return false;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
      *error = std::string("socketpair: ") + std::strerror(errno);
      return false;
    }
    // Only the child's end may survive exec, and only into this child: later peers
    // must not inherit it, or this peer would never see EOF when the test goes away.
    fcntl(sv[0], F_SETFD, FD_CLOEXEC);
    std::string fd_arg = std::to_string(sv[1]);
    std::string path_arg = path;
    std::string sock_flag = "--sock";
    char* argv[] = {path_arg.data(), sock_flag.data(), fd_arg.data(), nullptr};
    pid_t pid = -1;
    int rc = posix_spawn(&pid, path, nullptr, nullptr, argv, environ);
    close(sv[1]);
    if (rc != 0) {
      close(sv[0]);
      *error = std::string("posix_spawn ") + path + ": " + std::strerror(rc);
      return false;
    }
    sock_ = sv[0];
    pid_ = pid;
    return true;
  }

  // Sends one command and waits for its reply.
  PeerReply Call(const std::string& command, int fd = -1, int timeout_ms = 60000) {
    PeerReply reply;
    reply.code = CUDA_ERROR_UNKNOWN;
    if (sock_ < 0) {
      reply.line = "peer not running";
      return reply;
    }
    if (!SendMessage(sock_, command, fd)) {
      reply.line = "send failed: " + std::string(std::strerror(errno));
      return reply;
    }
    std::string text;
    RecvStatus st = ReceiveMessage(sock_, &text, &reply.fd, timeout_ms);
    if (st != RecvStatus::kOk) {
      reply.line = st == RecvStatus::kTimeout  ? "peer timed out on '" + command + "'"
                   : st == RecvStatus::kClosed ? "peer closed the socket on '" + command + "'"
                                               : "receive failed on '" + command + "'";
      return reply;
    }
    reply.line = text;
    std::vector<std::string> words = SplitWords(text);
    if (!words.empty() && words[0] == "OK") {
      reply.ok = true;
      reply.code = CUDA_SUCCESS;
      reply.values.assign(words.begin() + 1, words.end());
    } else if (words.size() >= 2 && words[0] == "ERR") {
      uint64_t code = 0;
      reply.code = ParseU64(words[1], &code) ? static_cast<CUresult>(code) : CUDA_ERROR_UNKNOWN;
    }
    return reply;
  }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // SIGKILLs the peer and reaps it. Returns the wait status.
  int Kill() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGKILL);
    return Reap();
  }

  // Asks the peer to exit, waits up to 10 s, then kills it. Returns the wait status.
  int Stop() {
    if (pid_ <= 0) return -1;
    PeerReply r = Call("exit", -1, 10000);
    if (r.fd >= 0) close(r.fd);
    close(sock_);
    sock_ = -1;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int status = 0;
    while (true) {
      pid_t w = waitpid(pid_, &status, WNOHANG);
      if (w == pid_ || (w < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pid_ = -1;
    return status;
  }

 private:
  int Reap() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    if (sock_ >= 0) close(sock_);
    sock_ = -1;
    pid_ = -1;
    return status;
  }

  int sock_ = -1;
  pid_t pid_ = -1;
};

// ---------------------------------------------------------------------------------------
// Driver-side helpers with no assertion framework
// ---------------------------------------------------------------------------------------

inline CUmemAllocationProp DeviceProp(int device = 0,
                                      CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_NONE) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = types;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

inline CUmemAccessDesc AccessDesc(CUmemAccess_flags flags, int device = 0) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = flags;
  return desc;
}

inline CUmemLocation DeviceLocation(int device = 0) {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = device;
  return loc;
}

inline void* AsOsHandle(int fd) {
  return reinterpret_cast<void*>(static_cast<intptr_t>(fd));
}

inline void* AsPtr(CUdeviceptr p) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

// Checks made inside a child process (the statement of an EXPECT_EXIT): an assertion
// failure there would be lost, so failures are printed to stderr and turned into the
// exit status, which the parent checks with ExitedWithCode(0).
class ChildChecks {
 public:
  void Cu(CUresult expected, CUresult actual, const char* what) {
    if (expected == actual) return;
    std::fprintf(stderr, "FAILED: %s returned %s, expected %s\n", what, CuName(actual).c_str(),
                 CuName(expected).c_str());
    ++failures_;
  }
  void True(bool condition, const char* what) {
    if (condition) return;
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures_;
  }
  [[noreturn]] void Exit() {
    std::fflush(stderr);
    _exit(failures_ == 0 ? 0 : 1);
  }

 private:
  int failures_ = 0;
};

}  // namespace thaw_vmm_test

// ---------------------------------------------------------------------------------------
// GoogleTest part
// ---------------------------------------------------------------------------------------
#ifdef GOOGLETEST_INCLUDE_GTEST_GTEST_H_

#include <initializer_list>

namespace thaw_vmm_test {

inline ::testing::AssertionResult CuResultIs(const char* expected_expr, const char* actual_expr,
                                             CUresult expected, CUresult actual) {
  if (expected == actual) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << actual_expr << " returned " << CuName(actual) << ", expected " << CuName(expected)
         << " (" << expected_expr << ")";
}

inline ::testing::AssertionResult CuResultIn(const char* expected_expr, const char* actual_expr,
                                             std::initializer_list<CUresult> expected,
                                             CUresult actual) {
  std::string names;
  for (CUresult e : expected) {
    if (e == actual) return ::testing::AssertionSuccess();
    names += (names.empty() ? "" : " or ") + CuName(e);
  }
  return ::testing::AssertionFailure() << actual_expr << " returned " << CuName(actual)
                                       << ", expected " << names << " (" << expected_expr << ")";
}

}  // namespace thaw_vmm_test

#define EXPECT_CU(expected, call) EXPECT_PRED_FORMAT2(::thaw_vmm_test::CuResultIs, expected, call)
#define ASSERT_CU(expected, call) ASSERT_PRED_FORMAT2(::thaw_vmm_test::CuResultIs, expected, call)
#define EXPECT_CU_OK(call) EXPECT_CU(CUDA_SUCCESS, call)
#define ASSERT_CU_OK(call) ASSERT_CU(CUDA_SUCCESS, call)
// For rules where cuda.h documents that a call fails but not which of its listed codes
// it returns: the call must fail with one of the given codes (and, checked separately,
// without side effects).
#define EXPECT_CU_ONE_OF(call, ...)                                                                \
  EXPECT_PRED_FORMAT2(::thaw_vmm_test::CuResultIn, (std::initializer_list<CUresult>{__VA_ARGS__}), \
                      call)

namespace thaw_vmm_test {

// Initialises the driver, makes device 0's primary context current (cuMemGetInfo, the
// copy calls and cuPointerGetAttribute need a context; the VMM calls do not) and checks
// at the end that the test left nothing behind: every test must release what it made.
// The leak checks read the emulator's counters, so a real driver (the conformance program)
// goes without them, as it does without every other use of DevStats/ProcStats/BytesInUse.
class VmmFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU_OK(cuInit(0));
    ASSERT_CU_OK(cuDeviceGet(&dev_, 0));
    ASSERT_CU_OK(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU_OK(cuCtxSetCurrent(ctx_));
    if (!::thaw::test::on_emulator()) return;
    baseline_ = DevStats();
    proc_baseline_ = ProcStats();
  }

  void TearDown() override {
    if (ctx_ == nullptr) return;
    if (!::thaw::test::on_emulator()) {
      cuCtxSetCurrent(nullptr);
      EXPECT_CU_OK(cuDevicePrimaryCtxRelease(dev_));
      return;
    }
    ThawEmuDeviceStats now = DevStats();
    ThawEmuProcessStats pnow = ProcStats();
    EXPECT_EQ(now.device_bytes_in_use, baseline_.device_bytes_in_use) << "test leaked memory";
    EXPECT_EQ(now.vmm_handle_refs, baseline_.vmm_handle_refs) << "test leaked handle refs";
    EXPECT_EQ(now.vmm_mappings, baseline_.vmm_mappings) << "test leaked mappings";
    EXPECT_EQ(pnow.reservations, proc_baseline_.reservations) << "test leaked reservations";
    cuCtxSetCurrent(nullptr);
    EXPECT_CU_OK(cuDevicePrimaryCtxRelease(dev_));
  }

  // Zeros on a real driver, where every check that reads them is left out (THAW_EMU_CHECK).
  static ThawEmuDeviceStats DevStats(int device = 0) {
    ThawEmuDeviceStats s{};
    if (!::thaw::test::on_emulator()) return s;
    int rc = thawEmuGetDeviceStats(device, &s);
    EXPECT_EQ(rc, CUDA_SUCCESS) << "thawEmuGetDeviceStats";
    return s;
  }

  static ThawEmuProcessStats ProcStats() {
    ThawEmuProcessStats s{};
    if (!::thaw::test::on_emulator()) return s;
    int rc = thawEmuGetProcessStats(&s);
    EXPECT_EQ(rc, CUDA_SUCCESS) << "thawEmuGetProcessStats";
    return s;
  }

  // Bytes in use on device 0 by this test (relative to SetUp).
  unsigned long long BytesInUse() const {
    return DevStats().device_bytes_in_use - baseline_.device_bytes_in_use;
  }

  size_t FreeMemory() {
    size_t free = 0, total = 0;
    EXPECT_CU_OK(cuMemGetInfo(&free, &total));
    return free;
  }

  CUmemGenericAllocationHandle Create(size_t size,
                                      CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_NONE) {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = DeviceProp(0, types);
    EXPECT_CU_OK(cuMemCreate(&h, size, &prop, 0)) << "size " << size;
    return h;
  }

  CUdeviceptr Reserve(size_t size, size_t alignment = 0) {
    CUdeviceptr p = 0;
    EXPECT_CU_OK(cuMemAddressReserve(&p, size, alignment, 0, 0)) << "size " << size;
    return p;
  }

  static void SetAccess(CUdeviceptr p, size_t size,
                        CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    CUmemAccessDesc desc = AccessDesc(flags);
    EXPECT_CU_OK(cuMemSetAccess(p, size, &desc, 1));
  }

  // Reserves `size` bytes, creates an allocation of the same size, maps it and grants
  // read-write access. The caller unmaps, releases and frees.
  struct Mapped {
    CUdeviceptr va = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  Mapped CreateMapped(size_t size, CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_NONE) {
    Mapped m;
    m.size = size;
    m.handle = Create(size, types);
    m.va = Reserve(size);
    EXPECT_CU_OK(cuMemMap(m.va, size, 0, m.handle, 0));
    SetAccess(m.va, size);
    return m;
  }
  // The test's bytes into and out of device memory. On the emulator through the host: device
  // pointers are host addresses there and host access follows the mapping's access flags, which
  // the tests rely on. On a real driver, whose device memory the CPU cannot touch (the
  // conformance program), through synchronous driver copies, which need a current context.
  static void WritePattern(CUdeviceptr p, size_t len, uint64_t seed) {
    if (::thaw::test::on_emulator()) {
      FillPattern(AsPtr(p), len, seed);
      return;
    }
    std::vector<uint8_t> bytes(len);
    FillPattern(bytes.data(), len, seed);
    EXPECT_CU_OK(cuMemcpyHtoD(p, bytes.data(), len));
  }
  static long long CheckPattern(CUdeviceptr p, size_t len, uint64_t seed,
                                uint64_t first_offset = 0) {
    if (::thaw::test::on_emulator()) return FirstPatternMismatch(AsPtr(p), len, seed, first_offset);
    std::vector<uint8_t> bytes(len);
    EXPECT_CU_OK(cuMemcpyDtoH(bytes.data(), p, len));
    return FirstPatternMismatch(bytes.data(), len, seed, first_offset);
  }

  static void Destroy(const Mapped& m) {
    EXPECT_CU_OK(cuMemUnmap(m.va, m.size));
    EXPECT_CU_OK(cuMemRelease(m.handle));
    EXPECT_CU_OK(cuMemAddressFree(m.va, m.size));
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  ThawEmuDeviceStats baseline_{};
  ThawEmuProcessStats proc_baseline_{};
  static constexpr size_t G = kGranularity;
};

}  // namespace thaw_vmm_test

#endif  // GOOGLETEST_INCLUDE_GTEST_GTEST_H_

#endif  // THAW_TESTS_EMU_VMM_HELPERS_HPP
