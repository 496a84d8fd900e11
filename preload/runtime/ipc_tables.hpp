// The CUDA IPC translation's tables (preload/hooks/ipc_hooks.cpp): handles this process
// exported of the layout's allocations, and handles of other processes it opened. Owned by
// the ShimRuntime, so that its fork steps hold `mutex` across fork().
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace thaw::preload {

struct IpcOpened {
  std::uint64_t key;  // what identifies the exporter's memory (token, or pid and fd)
  std::uint64_t mapped;
  int refs;
};

struct IpcTables {
  std::mutex mutex;
  std::map<CUdeviceptr, CUipcMemHandle> exported;  // by allocation base
  std::map<CUdeviceptr, IpcOpened> opened;         // by mapped address
};

}  // namespace thaw::preload
