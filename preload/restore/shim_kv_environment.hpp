// The KvRestore environment of the real shim (defined in restore_abi.cpp, beside the ABI's C
// entry points): the driver's and the engine's memory as the engine sees them, thawd's
// "kvcache" artifacts.
#pragma once

#include "preload/restore/kv_restore.hpp"

namespace thaw::preload {

restore::KvRestoreEnvironment shim_kv_environment();

}  // namespace thaw::preload
