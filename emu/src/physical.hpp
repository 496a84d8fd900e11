// Physical device memory: one memfd per allocation (cuMemCreate, and the backing of
// each cuMemAlloc). A trailer page after the allocation's bytes says what it is, so a
// process that receives the fd (SCM_RIGHTS, /proc/<pid>/fd) can import it and check it
// came from the emulator.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <expected>
#include <memory>

#include "ledger.hpp"

namespace emu {

enum class PhysicalKind : std::uint32_t { kVmm = 1, kLegacy = 2 };

class PhysicalMemory {
 public:
  // Charges the device's ledger; CUDA_ERROR_OUT_OF_MEMORY when the device is full.
  static std::expected<std::shared_ptr<PhysicalMemory>, CUresult> create(int device,
                                                                         std::uint64_t size,
                                                                         std::uint32_t handle_types,
                                                                         PhysicalKind kind);
  // Takes its own duplicate of `fd`. CUDA_ERROR_INVALID_VALUE if it is not emulator memory.
  static std::expected<std::shared_ptr<PhysicalMemory>, CUresult> import(int fd);

  PhysicalMemory(const PhysicalMemory&) = delete;
  PhysicalMemory& operator=(const PhysicalMemory&) = delete;
  ~PhysicalMemory();

  int fd() const { return fd_; }
  int device() const { return device_; }
  std::uint64_t size() const { return size_; }
  std::uint32_t handle_types() const { return handle_types_; }
  PhysicalKind kind() const { return kind_; }
  LedgerKey key() const { return key_; }
  // The process that created it (for legacy IPC handles).
  int creator_pid() const { return creator_pid_; }

 private:
  PhysicalMemory() = default;
  int fd_ = -1;
  int device_ = 0;
  std::uint64_t size_ = 0;
  std::uint32_t handle_types_ = 0;
  PhysicalKind kind_ = PhysicalKind::kVmm;
  LedgerKey key_{};
  int creator_pid_ = 0;
  bool charged_ = false;
};

}  // namespace emu
