#include "common/readiness/shared_futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace thaw::store {

FutexWaitResult futex_wait_shared(const uint32_t* word, uint32_t expected,
                                  const timespec* deadline) {
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline (FUTEX_WAIT takes a
  // relative one), so a loop that is woken for chunks it does not want keeps the
  // caller's original deadline without recomputing it. Not OR-ed with
  // FUTEX_PRIVATE_FLAG: see the header.
  const long rc = ::syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expected, deadline, nullptr,
                            FUTEX_BITSET_MATCH_ANY);
  if (rc == 0) return FutexWaitResult::woken;
  switch (errno) {
    case EAGAIN:
      return FutexWaitResult::value_changed;
    case ETIMEDOUT:
      return FutexWaitResult::timed_out;
    case EINTR:
      return FutexWaitResult::interrupted;
    default:
      // EFAULT / EINVAL cannot happen for a word inside a live mapping; report it as a
      // wake so the caller re-checks its condition rather than sleeping forever.
      return FutexWaitResult::woken;
  }
}

int futex_wake_all_shared(const uint32_t* word) {
  const long rc = ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  return rc < 0 ? 0 : static_cast<int>(rc);
}

}  // namespace thaw::store
