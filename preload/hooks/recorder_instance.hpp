// The process's LayoutRecorder (preload/artifact), wired to the real driver (device name,
// driver version), to thawd (records read and stored as artifacts of kind "layout") and to
// the layout it observes. nullptr with THAW_PRELOAD_DETERMINISTIC=0 or the shim disabled.
#pragma once

#include <string>

#include "preload/artifact/layout_recorder.hpp"

namespace thaw::preload {

LayoutRecorder* recorder_instance();

// The engine's fingerprint: the program file (path, size, modification time) and
// $THAW_ENGINE_ID when set (to tell apart engines one interpreter runs, e.g. "vllm-0.11").
std::string engine_fingerprint();

// At exit: the run's record and the shim's counters go to thawd.
void report_at_exit();

// In a forked child: the child is a run of its own.
void recorder_after_fork_in_child();

}  // namespace thaw::preload
