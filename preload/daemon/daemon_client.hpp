// The shim's connection to thawd (common/proto over $THAW_SOCKET, default
// /run/thaw/thawd.sock), opened on first need and said hello to with the engine's identity.
//
// Everything here is optional: with no thawd, an old one, a dead one or a refused hello,
// calls return nullopt, the shim says so once and goes on without it (streamed files then
// use the cache's own readiness maps). A connection that fails mid-way is dropped and not
// retried for the rest of the process.
#pragma once

#include <optional>
#include <string>

#include "common/fd/unique_fd.hpp"

namespace thaw::preload {

// The readiness map of a cached model file, from thawd (open_file). nullopt when thawd
// is not there or does not know the file.
std::optional<UniqueFd> daemon_readiness_fd(const std::string& model_key,
                                            const std::string& relative_path);

}  // namespace thaw::preload
