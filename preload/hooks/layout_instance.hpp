// The process's DeterministicLayout, built on first use from the real driver's VMM entry
// points (nullptr until a driver is loaded, or with THAW_PRELOAD_DETERMINISTIC=0).
#pragma once

#include "preload/layout/deterministic_layout.hpp"

namespace thaw::preload {

DeterministicLayout* layout_instance();

}  // namespace thaw::preload
