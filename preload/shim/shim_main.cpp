// What runs when the dynamic loader maps libthaw-preload.so into an engine: the runtime's
// first step (hooks may have run before it, and built the runtime on first use).
#include "preload/runtime/shim_runtime.hpp"

namespace {

__attribute__((constructor)) void thaw_preload_loaded() {
  thaw::preload::runtime().on_library_loaded();
}

}  // namespace
