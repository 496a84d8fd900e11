// What runs when the dynamic loader maps libthaw-preload.so into an engine.
#include <cstdlib>

#include "preload/hooks/recorder_instance.hpp"
#include "preload/shim/shim_state.hpp"

namespace {

void thaw_preload_exiting() {
  thaw::preload::report_at_exit();
}

__attribute__((constructor)) void thaw_preload_loaded() {
  using namespace thaw::preload;
  register_fork_handler();
  // Runs after the engine's own exit handlers (registered later): the run is over then.
  std::atexit(&thaw_preload_exiting);
  if (config().disabled) {
    notice_once("disabled", "THAW_PRELOAD_DISABLE is set: every call passes through");
  }
  debug("loaded (deterministic layout {}, VA base {:#x})", config().deterministic ? "on" : "off",
        config().va_base);
}

}  // namespace
