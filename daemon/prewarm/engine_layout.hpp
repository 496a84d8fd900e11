// The engine layout of a model: where an engine of this node put the model's bytes on its
// own last start-up (its layout record, kept by thawd as an artifact of kind "layout"), as a
// vmm::WeightLayout — so a slot prewarmed in it holds, at offset o, exactly what that engine
// will have at its region base + o, and the shim can map the slot's pages there (weight
// injection's zero-copy mode).
#pragma once

#include <string>
#include <string_view>

#include "common/safetensors/model.hpp"
#include "daemon/service/service_error.hpp"
#include "vmm/weight_layout.hpp"

namespace thaw::daemon {

struct EngineLayout {
  vmm::WeightLayout layout;
  std::string fingerprint;  // layout::record_fingerprint of the record's text
};

// From a record's text and the model it was recorded on (the cached copy). Each copy of the
// record becomes a piece at allocation offset + offset, with the layer of the tensor its
// first byte belongs to. Refused — the caller then prewarms the packed layout — when the
// record names a file or range the model does not have, or two copies overlap.
ServiceResult<EngineLayout> engine_layout_from_record(std::string_view document,
                                                      const safetensors::Model& model);

}  // namespace thaw::daemon
