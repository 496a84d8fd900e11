// What the memory hooks ask the capture hooks (capture_hooks.cpp).
#pragma once

namespace thaw::preload {

// Whether a stream capture in progress makes the driver refuse a "potentially unsafe" call
// (cuMemAlloc, cuMemFree) by the calling thread now: then the hook lets the driver answer
// it, which refuses it with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
// capture. False at once (one atomic load) while no restricting capture is in progress.
bool capture_restricts_unsafe_calls();

}  // namespace thaw::preload
