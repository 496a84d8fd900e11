// common/safetensors uses thaw's shared owned descriptor.
#pragma once

#include "common/fd/unique_fd.hpp"

namespace thaw::safetensors {
using thaw::UniqueFd;
}  // namespace thaw::safetensors
