// The per-device memory ledger shared by every process using an emulated GPU.
//
// A real GPU's memory is one pool for all processes: cuMemGetInfo and out-of-memory
// see everyone's allocations, and a process that dies gives its memory back. The
// ledger is a small file per device in the state directory, mapped shared and locked
// with flock: each process records which physical allocations it references. An
// allocation is counted once however many processes reference it (an exporter and its
// importers), and entries of dead processes are dropped when anyone next looks.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <expected>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace emu {

struct LedgerKey {
  std::uint64_t inode;  // of the memfd backing the allocation
  std::uint64_t id;     // random per allocation: inode numbers are reused
  bool operator==(const LedgerKey&) const = default;
};

class DeviceLedger {
 public:
  DeviceLedger() = default;
  DeviceLedger(const DeviceLedger&) = delete;
  DeviceLedger& operator=(const DeviceLedger&) = delete;
  ~DeviceLedger();

  std::expected<void, std::string> open(const std::string& dir, int device, std::uint64_t capacity);
  // Records a new allocation; CUDA_ERROR_OUT_OF_MEMORY when the device is full.
  CUresult charge(LedgerKey key, std::uint64_t bytes);
  // Records that this process now also references an existing allocation (import).
  void attach(LedgerKey key, std::uint64_t bytes);
  // This process no longer references the allocation.
  void detach(LedgerKey key);
  // Bytes referenced by live processes, each allocation counted once.
  std::uint64_t used();
  std::uint64_t used_by_self();
  std::uint64_t capacity() const { return capacity_; }

 private:
  struct Header;
  struct Entry;
  class Lock;
  void prune_dead();
  std::uint64_t used_locked() const;
  bool add_entry(LedgerKey key, std::uint64_t bytes);

  std::mutex mu_;  // flock does not exclude threads that share the descriptor
  int fd_ = -1;
  Header* header_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::uint64_t start_time_ = 0;  // of this process, to tell a reused pid from us
  // Processes whose start time was checked recently (under mu_). Reading /proc/<pid>/stat on
  // every allocation made the emulator's own bookkeeping cost more than the driver work it
  // models (tens of us per call); within kVerifiedFor of a check, kill(pid, 0) alone says
  // whether the process still exists (a dead one is pruned at once, as before; only a pid
  // reused within that second could be mistaken, which pid allocation makes all but
  // impossible).
  static constexpr std::chrono::seconds kVerifiedFor{1};
  std::unordered_map<std::int32_t, std::pair<std::uint64_t, std::chrono::steady_clock::time_point>>
      verified_;  // pid → (start time, when checked)
};

// Process start time from /proc/<pid>/stat (clock ticks since boot); 0 if gone.
std::uint64_t process_start_time(int pid);

}  // namespace emu
