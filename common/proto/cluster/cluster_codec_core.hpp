// The decode-and-validate core of the control plane's codec (cluster.proto): every rule a
// received message must pass, with errors reported as a string ("" = valid) and the message
// through an out-parameter, not std::expected, so that it also builds with clang 14 +
// libstdc++ 12 (the libFuzzer build in tests/fuzz), which lacks <expected>. cluster_codec.hpp
// is the API everything else uses.
//
// An error is one line (at most a few hundred bytes) naming what was wrong; strings the peer
// sent appear in it quoted and cut short, so a hostile peer cannot forge log lines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/proto/cluster/cluster.pb.h"

namespace thaw::cluster {

inline constexpr std::uint32_t kProtocolVersion = 1;
// Larger messages are refused before parsing (a Register of a node with many cached models
// and slots is a few KiB).
inline constexpr std::size_t kMaxInboundBytes = 1u << 20;
// Replies carry ClusterState (every node's registration), so they get a larger bound; it only
// keeps a broken peer from making thawctl parse gigabytes.
inline constexpr std::size_t kMaxReplyBytes = 64u << 20;
// A gateway's report interval: longer would make its subscription outlive a dead gateway by
// minutes.
inline constexpr double kMaxGatewayIntervalS = 60;

// Sets `version` and serialises.
std::string encode(v1::NodeMessage message);
std::string encode(v1::CoordinatorMessage message);
std::string encode(v1::FrontendRequest message);
std::string encode(v1::FrontendReply message);

std::string_view task_kind_name(v1::TaskKind kind);
std::string_view task_state_name(v1::TaskState state);

namespace core {

// Each returns "" and fills `out` when the bytes are a valid message; otherwise returns what
// was wrong and leaves `out` cleared (never half-read).
std::string decode_node_message(std::string_view bytes, v1::NodeMessage& out);
std::string decode_coordinator_message(std::string_view bytes, v1::CoordinatorMessage& out);
std::string decode_frontend_request(std::string_view bytes, v1::FrontendRequest& out);
std::string decode_frontend_reply(std::string_view bytes, v1::FrontendReply& out);

// The checks the decoders apply, for messages built in memory: "" when valid.
std::string validate_node_id(std::string_view id);
std::string validate_model_spec(const v1::ModelSpec& spec);
std::string validate_task(const v1::Task& task);
std::string validate_class_rates(const v1::ClassRates& rates);

// `s` for an error message: in double quotes, bytes outside printable ASCII and quotes
// escaped as \xNN, cut to 64 bytes (then "...").
std::string quoted(std::string_view s);

}  // namespace core
}  // namespace thaw::cluster
