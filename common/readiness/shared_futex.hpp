// Futex wait / wake on a word in a MAP_SHARED mapping, across processes.
//
// The non-PRIVATE operations are used on purpose: a FUTEX_*_PRIVATE op keys the wait
// queue by (mm, address), so a waker in another process (the daemon) would never find
// a consumer's waiter. The shared ops key it by (inode, offset) of the mapped file, so
// every process that maps the same readiness file meets on the same queue, whatever
// address it mapped it at. Waiting only reads the word, so a PROT_READ mapping suffices.
#pragma once

#include <cstdint>
#include <ctime>

namespace thaw::store {

enum class FutexWaitResult {
  woken,          // woken by futex_wake_all (or spuriously): re-check the condition
  value_changed,  // *word was no longer `expected` when the kernel looked (EAGAIN)
  timed_out,      // the deadline passed
  interrupted,    // a signal arrived (EINTR)
};

// Sleeps while *word == expected, until woken or until `deadline` (an absolute
// CLOCK_MONOTONIC time; nullptr waits without limit).
FutexWaitResult futex_wait_shared(const uint32_t* word, uint32_t expected,
                                  const timespec* deadline);

// Wakes every waiter on `word` in every process. Returns how many were woken.
int futex_wake_all_shared(const uint32_t* word);

}  // namespace thaw::store
