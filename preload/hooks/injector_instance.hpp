// The process's WeightInjector (preload/inject), once the engine is attached to a prewarmed
// slot: wired to the real driver, to thawd (pages given back, the slot released at exit),
// to the recorder (which record this run follows) and to the deterministic layout (whose
// allocations map the slot's pages in zero-copy mode).
#pragma once

#include "preload/inject/weight_injector.hpp"

namespace thaw::preload {

// What attach granted; the injector is built from it on the first hook call after the
// driver is loaded (attach usually happens before CUDA starts).
void install_injector(SlotGrant grant);
// nullptr when not attached (or the driver lacks what injection needs).
WeightInjector* injector_instance();
// At exit: outstanding copies finish, and the slot goes back to thawd — handed back
// prewarmed when its pages still hold the model.
void finish_injection_at_exit();

}  // namespace thaw::preload
