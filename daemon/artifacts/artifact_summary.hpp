// What an operator is told about one stored artifact (thawctl artifacts, the D-Bus method
// ListArtifacts): a line saying what the record holds, read with the codec of its kind where
// common/ has one — "graphs" with common/graphs (graph_record_from_json), "layout" with
// common/layout (layout_record_from_json) — and, for "kvcache", whose parser lives in the shim
// (preload/restore/kv_record), only the sizes the document states. A record its codec refuses
// is summarized as unreadable with the codec's reason: it is the operator's to remove (engines
// record a new one), never an error of the listing, and nothing in it can throw past here.
#pragma once

#include <string>
#include <string_view>

namespace thaw::daemon {

struct ArtifactSummary {
  bool readable = false;
  std::string text;  // "3 graphs, 276 nodes" or, when not readable, why not
};

// `text`: the stored document, as read from the state directory (untrusted).
ArtifactSummary summarize_artifact(std::string_view kind, std::string_view text);

}  // namespace thaw::daemon
