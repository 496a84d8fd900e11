#include "ledger.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace emu {

namespace {
constexpr char kMagic[8] = {'T', 'H', 'A', 'W', 'L', 'D', 'G', '1'};
constexpr std::uint32_t kMaxEntries = 65536;
}  // namespace

struct DeviceLedger::Entry {
  std::int32_t pid;
  std::uint32_t reserved;
  std::uint64_t start_time;
  std::uint64_t inode;
  std::uint64_t id;
  std::uint64_t bytes;
};

struct DeviceLedger::Header {
  char magic[8];
  std::uint32_t count;  // live entries are [0, count): removal swaps the last one in
  std::uint32_t reserved;
  Entry entries[kMaxEntries];
};

class DeviceLedger::Lock {
 public:
  explicit Lock(DeviceLedger& l) : l_(l), guard_(l.mu_) {
    while (flock(l_.fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~Lock() { flock(l_.fd_, LOCK_UN); }

 private:
  DeviceLedger& l_;
  std::lock_guard<std::mutex> guard_;
};

std::uint64_t process_start_time(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string s((std::istreambuf_iterator<char>(f)), {});
  auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  // Fields after "pid (comm)" start at field 3 (state); starttime is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return 0;
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

DeviceLedger::~DeviceLedger() {
  if (header_ != nullptr) munmap(header_, sizeof(Header));
  if (fd_ >= 0) close(fd_);
}

std::expected<void, std::string> DeviceLedger::open(const std::string& dir, int device,
                                                    std::uint64_t capacity) {
  capacity_ = capacity;
  start_time_ = process_start_time(getpid());
  // World-writable with the sticky bit, like /tmp: the daemon (root) and engines
  // (other users) share one emulated GPU.
  if (mkdir(dir.c_str(), 01777) != 0 && errno != EEXIST) {
    return std::unexpected(
        fmt::format("cannot create THAW_EMU_STATE_DIR '{}': {}", dir, std::strerror(errno)));
  }
  chmod(dir.c_str(), 01777);
  std::string path = fmt::format("{}/device{}.ledger", dir, device);
  mode_t old = umask(0);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  umask(old);
  if (fd_ < 0) {
    return std::unexpected(
        fmt::format("cannot open memory ledger '{}': {}", path, std::strerror(errno)));
  }
  {
    std::lock_guard guard(mu_);
    flock(fd_, LOCK_EX);
    struct stat st {};
    fstat(fd_, &st);
    bool fresh = st.st_size < static_cast<off_t>(sizeof(Header));
    if (fresh && ftruncate(fd_, sizeof(Header)) != 0) {
      flock(fd_, LOCK_UN);
      return std::unexpected(
          fmt::format("cannot size ledger '{}': {}", path, std::strerror(errno)));
    }
    void* p = mmap(nullptr, sizeof(Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
      flock(fd_, LOCK_UN);
      return std::unexpected(fmt::format("cannot map ledger '{}': {}", path, std::strerror(errno)));
    }
    header_ = static_cast<Header*>(p);
    if (fresh || std::memcmp(header_->magic, kMagic, sizeof(kMagic)) != 0) {
      std::memset(static_cast<void*>(header_), 0, offsetof(Header, entries));
      std::memcpy(header_->magic, kMagic, sizeof(kMagic));
    }
    flock(fd_, LOCK_UN);
  }
  return {};
}

void DeviceLedger::prune_dead() {
  const auto now = std::chrono::steady_clock::now();
  const std::int32_t self = getpid();
  std::unordered_map<std::int32_t, bool> alive;
  std::uint32_t i = 0;
  while (i < header_->count) {
    Entry& e = header_->entries[i];
    auto it = alive.find(e.pid);
    if (it == alive.end()) {
      bool live = e.pid == self && e.start_time == start_time_;
      if (!live) {
        const bool exists = kill(e.pid, 0) == 0 || errno == EPERM;
        auto seen = verified_.find(e.pid);
        if (exists && seen != verified_.end() && seen->second.first == e.start_time &&
            now - seen->second.second < kVerifiedFor) {
          live = true;
        } else {
          live = exists && process_start_time(e.pid) == e.start_time;
          if (live) {
            verified_[e.pid] = {e.start_time, now};
          } else {
            verified_.erase(e.pid);
          }
        }
      }
      it = alive.emplace(e.pid, live).first;
    }
    if (!it->second) {
      e = header_->entries[--header_->count];
    } else {
      ++i;
    }
  }
}

std::uint64_t DeviceLedger::used_locked() const {
  struct KeyHash {
    std::size_t operator()(const LedgerKey& k) const { return k.inode * 31 + k.id; }
  };
  std::unordered_set<LedgerKey, KeyHash> seen;
  std::uint64_t total = 0;
  for (std::uint32_t i = 0; i < header_->count; ++i) {
    const Entry& e = header_->entries[i];
    if (seen.insert({e.inode, e.id}).second) total += e.bytes;
  }
  return total;
}

bool DeviceLedger::add_entry(LedgerKey key, std::uint64_t bytes) {
  if (header_->count >= kMaxEntries) return false;
  header_->entries[header_->count++] =
      Entry{static_cast<std::int32_t>(getpid()), 0, start_time_, key.inode, key.id, bytes};
  return true;
}

CUresult DeviceLedger::charge(LedgerKey key, std::uint64_t bytes) {
  Lock lock(*this);
  prune_dead();
  if (used_locked() + bytes > capacity_) return CUDA_ERROR_OUT_OF_MEMORY;
  return add_entry(key, bytes) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

void DeviceLedger::attach(LedgerKey key, std::uint64_t bytes) {
  Lock lock(*this);
  prune_dead();
  add_entry(key, bytes);
}

void DeviceLedger::detach(LedgerKey key) {
  Lock lock(*this);
  std::int32_t self = getpid();
  for (std::uint32_t i = 0; i < header_->count; ++i) {
    Entry& e = header_->entries[i];
    if (e.pid == self && e.inode == key.inode && e.id == key.id) {
      e = header_->entries[--header_->count];
      return;
    }
  }
}

std::uint64_t DeviceLedger::used() {
  Lock lock(*this);
  prune_dead();
  return used_locked();
}

std::uint64_t DeviceLedger::used_by_self() {
  Lock lock(*this);
  std::int32_t self = getpid();
  std::uint64_t total = 0;
  for (std::uint32_t i = 0; i < header_->count; ++i) {
    if (header_->entries[i].pid == self) total += header_->entries[i].bytes;
  }
  return total;
}

}  // namespace emu
