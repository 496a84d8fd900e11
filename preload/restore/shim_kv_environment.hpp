// The KvRestore environment of the real shim (defined in restore_abi.cpp, beside the ABI's C
// entry points): the driver's and the engine's memory as the engine sees them, thawd's
// "kvcache" artifacts; and the driver the graph restore's worker uses.
#pragma once

#include <memory>

#include "preload/restore/graph_restore.hpp"
#include "preload/restore/kv_restore.hpp"

namespace thaw::preload {

restore::KvRestoreEnvironment shim_kv_environment();
// The driver a graph restore's background worker builds with (the driver library's own entry
// points); nullptr when the driver lacks a call it needs.
std::unique_ptr<restore::GraphBuildDriver> shim_graph_build_driver();

}  // namespace thaw::preload
