#include "preload/files/streaming_mapping.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

constexpr std::size_t kPage = 4096;
// Bytes installed per fault: a few pages at once, so a sequential reader faults rarely.
constexpr std::size_t kSpan = 256 * 1024;

struct Streamed {
  std::uintptr_t base = 0;
  std::size_t length = 0;
  std::uint64_t offset = 0;  // file offset of base
  std::shared_ptr<ManagedFile> file;
  UniqueFd data;  // our own descriptor: the engine may close its own after mmap
};

class Userfaults {
 public:
  // nullptr when userfaultfd cannot be used here. Opened on the first streamed mapping.
  static Userfaults* instance() {
    if (Userfaults* u = peek()) return u;
    std::lock_guard lock(open_mutex());
    if (Userfaults* u = peek()) return u;
    if (unavailable_) return nullptr;
    auto* candidate = new Userfaults();  // lives for the whole process: its thread serves it
    if (!candidate->open()) {
      delete candidate;
      unavailable_ = true;
      return nullptr;
    }
    opened_.store(candidate, std::memory_order_release);
    return candidate;
  }
  // The instance if one was opened; never opens one (munmap asks on every call).
  static Userfaults* peek() { return opened_.load(std::memory_order_acquire); }

  // Fork: both locks are held across it, so that the child finds the table whole.
  static void before_fork() {
    open_mutex().lock();
    if (Userfaults* u = peek()) u->mutex_.lock();
  }
  static void after_fork_in_parent() {
    if (Userfaults* u = peek()) u->mutex_.unlock();
    open_mutex().unlock();
  }
  // In the child the parent's instance is dropped: its handler thread is not here, and its
  // userfaultfd belongs to the parent's address space (ranges registered on it would be the
  // parent's). The child opens its own at its first streamed mapping.
  static void after_fork_in_child() {
    new (&open_mutex()) std::mutex();
    if (Userfaults* u = peek()) {
      new (&u->mutex_) std::mutex();
      ::close(u->fd_);
      opened_.store(nullptr, std::memory_order_release);  // the object is left, unreachable
    }
  }

  bool add(Streamed s) {
    uffdio_register reg{};
    reg.range.start = s.base;
    reg.range.len = s.length;
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (::ioctl(fd_, UFFDIO_REGISTER, &reg) != 0) return false;
    std::lock_guard lock(mutex_);
    maps_[s.base] = std::move(s);
    return true;
  }

  void forget(std::uintptr_t base, std::size_t length) {
    std::lock_guard lock(mutex_);
    for (auto it = maps_.begin(); it != maps_.end();) {
      const bool overlaps =
          it->second.base < base + length && base < it->second.base + it->second.length;
      it = overlaps ? maps_.erase(it) : std::next(it);
    }
  }

 private:
  bool open() {
    int fd =
        static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    if (fd < 0 && errno == EINVAL)
      fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (fd < 0) {
      notice_once("uffd", fmt::format("userfaultfd unavailable ({}): mappings of model files "
                                      "still arriving wait for the whole range",
                                      std::strerror(errno)));
      return false;
    }
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = UFFD_FEATURE_THREAD_ID;
    if (::ioctl(fd, UFFDIO_API, &api) != 0) {
      ::close(fd);
      notice_once("uffd", "userfaultfd API handshake failed: mappings wait for the whole range");
      return false;
    }
    fd_ = fd;
    std::thread([this] { serve(); }).detach();
    return true;
  }

  // The handler thread: one fault at a time.
  void serve() {
    ReentryGuard guard;  // this thread's reads and copies are the shim's own
    std::vector<std::byte> buffer(kSpan);
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      uffd_msg msg{};
      if (::read(fd_, &msg, sizeof(msg)) != static_cast<ssize_t>(sizeof(msg))) continue;
      if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
      resolve(msg.arg.pagefault.address & ~(kPage - 1), msg.arg.pagefault.feat.ptid, buffer);
    }
  }

  void resolve(std::uintptr_t page, pid_t thread, std::vector<std::byte>& buffer) {
    std::shared_ptr<ManagedFile> file;
    int data = -1;
    std::uint64_t file_offset = 0;
    std::size_t span = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = maps_.upper_bound(page);
      if (it == maps_.begin()) return;
      --it;
      const Streamed& s = it->second;
      if (page >= s.base + s.length) return;
      file = s.file;
      data = s.data.get();
      file_offset = s.offset + (page - s.base);
      span = std::min<std::size_t>(kSpan, s.base + s.length - page);
    }
    const std::uint64_t in_file =
        file_offset >= file->size ? 0 : std::min<std::uint64_t>(span, file->size - file_offset);
    if (in_file > 0 && !wait_readable(*file, file_offset, in_file)) {
      ::syscall(SYS_tgkill, ::getpid(), thread, SIGBUS);
      return;
    }
    std::memset(buffer.data() + in_file, 0, span - in_file);
    if (in_file > 0 && ::pread(data, buffer.data(), in_file, static_cast<off_t>(file_offset)) !=
                           static_cast<ssize_t>(in_file)) {
      ::syscall(SYS_tgkill, ::getpid(), thread, SIGBUS);
      return;
    }
    uffdio_copy copy{};
    copy.dst = page;
    copy.src = reinterpret_cast<std::uintptr_t>(buffer.data());
    copy.len = span;
    if (::ioctl(fd_, UFFDIO_COPY, &copy) == 0) {
      counters().bytes_streamed.fetch_add(in_file, std::memory_order_relaxed);
      return;
    }
    // Some pages of the span were there already (an earlier span overlapped): page by page,
    // then wake whoever waits on the faulting page.
    for (std::size_t done = 0; done < span; done += kPage) {
      uffdio_copy one{};
      one.dst = page + done;
      one.src = reinterpret_cast<std::uintptr_t>(buffer.data() + done);
      one.len = kPage;
      one.mode = UFFDIO_COPY_MODE_DONTWAKE;
      (void)::ioctl(fd_, UFFDIO_COPY, &one);
    }
    uffdio_range wake{page, span};
    (void)::ioctl(fd_, UFFDIO_WAKE, &wake);
  }

  static std::mutex& open_mutex() {
    static auto* m = new std::mutex();  // never destroyed: hooks run during exit
    return *m;
  }
  static inline std::atomic<Userfaults*> opened_{nullptr};
  static inline bool unavailable_ = false;  // under open_mutex()

  int fd_ = -1;
  std::mutex mutex_;
  std::map<std::uintptr_t, Streamed> maps_;
};

}  // namespace

void* map_streaming(std::shared_ptr<ManagedFile> file, int fd, void* addr, std::size_t length,
                    int prot, int flags, off_t offset) {
  Userfaults* u = Userfaults::instance();
  if (u == nullptr || length == 0 || offset < 0 || offset % static_cast<off_t>(kPage) != 0) {
    return nullptr;
  }
  const std::string path = file->path;
  UniqueFd data(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!data) return nullptr;
  const int anon_flags = MAP_PRIVATE | MAP_ANONYMOUS | (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE));
  void* p = ::mmap(addr, length, prot, anon_flags, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const std::size_t mapped = (length + kPage - 1) / kPage * kPage;
  Streamed s{reinterpret_cast<std::uintptr_t>(p), mapped, static_cast<std::uint64_t>(offset),
             std::move(file), std::move(data)};
  if (!u->add(std::move(s))) {
    ::munmap(p, length);
    return nullptr;
  }
  counters().mappings_streamed.fetch_add(1, std::memory_order_relaxed);
  debug("mmap of {} [{}, +{}) served by userfaultfd as its bytes arrive", path, offset, length);
  return p;
}

void forget_streaming(void* addr, std::size_t length) {
  if (Userfaults* u = Userfaults::peek()) u->forget(reinterpret_cast<std::uintptr_t>(addr), length);
}

void streaming_before_fork() {
  Userfaults::before_fork();
}

void streaming_after_fork_in_parent() {
  Userfaults::after_fork_in_parent();
}

void streaming_after_fork_in_child() {
  Userfaults::after_fork_in_child();
}

}  // namespace thaw::preload
