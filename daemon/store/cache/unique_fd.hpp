// The store uses thaw's shared owned descriptor.
#pragma once

#include "common/fd/unique_fd.hpp"

namespace thaw::store {
using thaw::UniqueFd;
}  // namespace thaw::store
