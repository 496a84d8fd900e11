// What runs when the dynamic loader maps libthaw-preload.so into an engine.
#include "preload/shim/shim_state.hpp"

namespace {

__attribute__((constructor)) void thaw_preload_loaded() {
  using namespace thaw::preload;
  register_fork_handler();
  if (config().disabled) {
    notice_once("disabled", "THAW_PRELOAD_DISABLE is set: every call passes through");
  }
  debug("loaded (deterministic layout {}, VA base {:#x})", config().deterministic ? "on" : "off",
        config().va_base);
}

}  // namespace
