#include "daemon/artifacts/artifact_summary.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <exception>

#include <nlohmann/json.hpp>

#include "common/graphs/graph_record.hpp"
#include "common/layout/layout_record.hpp"
#include "common/proto/shim_messages.hpp"
#include "common/text/byte_size.hpp"

namespace thaw::daemon {

namespace {

ArtifactSummary readable(std::string text) {
  return {true, std::move(text)};
}
// Reasons are shown on D-Bus and in a terminal: printable ASCII only (a D-Bus string must be
// UTF-8; the codecs' messages are ASCII already, this is the guarantee).
ArtifactSummary unreadable(std::string_view why) {
  return {false, proto::printable(why, 512)};
}

std::string plural(std::uint64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

ArtifactSummary graphs_summary(std::string_view text) {
  auto record = graphs::graph_record_from_json(text);
  if (!record) return unreadable(record.error());
  std::uint64_t nodes = 0;
  for (const graphs::RecordedGraph& g : record->graphs) nodes += g.nodes.size();
  return readable(fmt::format("{}, {}, {}", plural(record->graphs.size(), "graph", "graphs"),
                              plural(nodes, "node", "nodes"),
                              plural(record->modules.size(), "module", "modules")));
}

ArtifactSummary layout_summary(const nlohmann::json& doc) {
  auto record = layout::layout_record_from_json(doc);
  if (!record) return unreadable(record.error());
  std::uint64_t copied = 0;
  for (const layout::RecordedCopy& c : record->copies) copied += c.bytes;
  return readable(fmt::format(
      "{}, {} of weights in {}{}", plural(record->allocations.size(), "allocation", "allocations"),
      text::format_bytes(static_cast<double>(copied)),
      plural(record->copies.size(), "copy", "copies"), record->truncated ? " (truncated)" : ""));
}

// The shim's parser (preload/restore/kv_record) is not thawd's to use: only the sizes the
// record states are read, and the shim alone decides whether it holds.
ArtifactSummary kvcache_summary(const nlohmann::json& doc) {
  auto kv = doc.find("kv");
  if (kv == doc.end() || !kv->is_object()) return unreadable("it has no \"kv\" sizing");
  auto bytes = kv->find("kv_bytes");
  auto blocks = kv->find("num_blocks");
  if (bytes == kv->end() || !bytes->is_number_unsigned() || blocks == kv->end() ||
      !blocks->is_number_unsigned()) {
    return unreadable("its \"kv\" sizing has no kv_bytes and num_blocks as unsigned integers");
  }
  return readable(fmt::format("KV cache of {} in {}",
                              text::format_bytes(bytes->get<std::uint64_t>()),
                              plural(blocks->get<std::uint64_t>(), "block", "blocks")));
}

}  // namespace

ArtifactSummary summarize_artifact(std::string_view kind, std::string_view text) try {
  // The graph codec checks the text's size and nesting before it parses: it takes the text.
  if (kind == "graphs") return graphs_summary(text);
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) return unreadable("it is not JSON");
  if (!doc.is_object()) return unreadable("it is not a JSON object");
  if (kind == "layout") return layout_summary(doc);
  if (kind == "kvcache") return kvcache_summary(doc);
  return readable(fmt::format("{} of JSON (no summary for kind \"{}\")",
                              text::format_bytes(static_cast<double>(text.size())), kind));
} catch (const std::exception& e) {
  // nlohmann's type errors on a document of an odd shape, or a failing allocation.
  return unreadable(fmt::format("reading it failed: {}", e.what()));
}

}  // namespace thaw::daemon
