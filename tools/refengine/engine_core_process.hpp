// --engine-core-process: the engine in a forked child, as vLLM V1 runs its EngineCore.
//
// vLLM V1's front end (LLM / AsyncLLM) parses and tokenizes requests and starts EngineCore in a
// separate process before any CUDA call (CUDA is not fork-safe once initialised); that process
// initialises the driver, loads the model and steps. Here the parent process does the same
// before the fork (options, checkpoint config, prompts) and then only waits: the child runs the
// whole engine and writes the results itself, so a run's output is the same either way.
#pragma once

#include <optional>

namespace refengine {

// Forks. In the child (the engine core) returns std::nullopt: the caller goes on to run the
// engine. In the parent, waits for the child and returns the status to exit with: the child's
// exit status, or 128 + N with a message on stderr when signal N killed it. The child gets
// SIGTERM if the parent dies first. Throws std::runtime_error when fork fails. The caller must
// not have touched the CUDA driver yet.
std::optional<int> fork_engine_core_process();

}  // namespace refengine
