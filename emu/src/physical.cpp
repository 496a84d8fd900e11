#include "physical.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

#include "driver.hpp"

namespace emu {
namespace {

constexpr char kMagic[8] = {'T', 'H', 'A', 'W', 'E', 'M', 'U', '1'};
constexpr std::uint64_t kTrailerSize = 4096;

struct Trailer {
  char magic[8];
  std::uint32_t version;
  std::int32_t device;
  std::uint64_t size;
  std::uint64_t id;
  std::uint32_t handle_types;
  std::uint32_t kind;
  std::int32_t creator_pid;
};

std::uint64_t random_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ getpid());
  return rng() | 1;
}

// Allocates and zeroes the memfd's pages now (THAW_EMU_PREFAULT): fallocate alone leaves
// tmpfs pages to be zeroed at their first touch, which is what prefaulting is to avoid.
bool prefault(int fd, std::uint64_t size) {
  if (size == 0) return true;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = madvise(p, size, MADV_POPULATE_WRITE) == 0;
  munmap(p, size);
  return ok;
}

// The error code stays CUDA_ERROR_OUT_OF_MEMORY (what cuMemCreate documents for running out of
// resources), but nothing about it says "descriptors": an emulated 80 GB device at 2 MiB pages
// needs 40,000 of them. Say which limit was hit, once per process.
void report_descriptor_limit(int error) {
  static std::once_flag once;
  std::call_once(once, [error] {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    if (error == ENFILE) {
      std::fprintf(stderr,
                   "thaw-emu: cuMemCreate: the system-wide open-file limit is reached (ENFILE, "
                   "fs.file-max): each physical allocation of emulated device memory is a memfd; "
                   "returning CUDA_ERROR_OUT_OF_MEMORY\n");
      return;
    }
    std::fprintf(stderr,
                 "thaw-emu: cuMemCreate: this process's open-file limit is reached "
                 "(RLIMIT_NOFILE: soft %llu, hard %llu; the emulator raised soft to hard at "
                 "cuInit). Each physical allocation of emulated device memory is one memfd — an "
                 "80 GB device in 2 MiB pages needs 40,000 — so raise the hard limit (ulimit -Hn, "
                 "LimitNOFILE= in a unit) or emulate a smaller device (THAW_EMU_DEVICE_MEMORY); "
                 "returning CUDA_ERROR_OUT_OF_MEMORY\n",
                 static_cast<unsigned long long>(rl.rlim_cur),
                 static_cast<unsigned long long>(rl.rlim_max));
  });
}

}  // namespace

std::expected<std::shared_ptr<PhysicalMemory>, CUresult> PhysicalMemory::create(
    int device, std::uint64_t size, std::uint32_t handle_types, PhysicalKind kind) {
  std::shared_ptr<PhysicalMemory> m(new PhysicalMemory());
  m->fd_ = memfd_create("thaw-emu-device-memory", MFD_CLOEXEC);
  if (m->fd_ < 0) {
    if (errno == EMFILE || errno == ENFILE) report_descriptor_limit(errno);
    return std::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  if (ftruncate(m->fd_, static_cast<off_t>(size + kTrailerSize)) != 0) {
    return std::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  if (driver().cfg().prefault && !prefault(m->fd_, size)) {
    return std::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  Trailer t{};
  std::memcpy(t.magic, kMagic, sizeof(kMagic));
  t.version = 1;
  t.device = device;
  t.size = size;
  t.id = random_id();
  t.handle_types = handle_types;
  t.kind = static_cast<std::uint32_t>(kind);
  t.creator_pid = getpid();
  if (pwrite(m->fd_, &t, sizeof(t), static_cast<off_t>(size)) != sizeof(t)) {
    return std::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  struct stat st {};
  fstat(m->fd_, &st);
  m->device_ = device;
  m->size_ = size;
  m->handle_types_ = handle_types;
  m->kind_ = kind;
  m->key_ = {static_cast<std::uint64_t>(st.st_ino), t.id};
  m->creator_pid_ = t.creator_pid;
  CUresult r = driver().device(device).ledger.charge(m->key_, size);
  if (r != CUDA_SUCCESS) return std::unexpected(r);
  m->charged_ = true;
  return m;
}

std::expected<std::shared_ptr<PhysicalMemory>, CUresult> PhysicalMemory::import(int fd) {
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size < static_cast<off_t>(kTrailerSize)) {
    return std::unexpected(CUDA_ERROR_INVALID_VALUE);
  }
  Trailer t{};
  std::uint64_t size = static_cast<std::uint64_t>(st.st_size) - kTrailerSize;
  if (pread(fd, &t, sizeof(t), static_cast<off_t>(size)) != sizeof(t) ||
      std::memcmp(t.magic, kMagic, sizeof(kMagic)) != 0 || t.size != size || t.device < 0 ||
      t.device >= driver().device_count()) {
    return std::unexpected(CUDA_ERROR_INVALID_VALUE);
  }
  std::shared_ptr<PhysicalMemory> m(new PhysicalMemory());
  m->fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (m->fd_ < 0) return std::unexpected(CUDA_ERROR_INVALID_VALUE);
  m->device_ = t.device;
  m->size_ = size;
  m->handle_types_ = t.handle_types;
  m->kind_ = static_cast<PhysicalKind>(t.kind);
  m->key_ = {static_cast<std::uint64_t>(st.st_ino), t.id};
  m->creator_pid_ = t.creator_pid;
  driver().device(t.device).ledger.attach(m->key_, size);
  m->charged_ = true;
  return m;
}

PhysicalMemory::~PhysicalMemory() {
  if (charged_) driver().device(device_).ledger.detach(key_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace emu
