// Decoding and validation of the control plane's messages (cluster.proto), for both ends.
//
// Every byte string that crosses a socket goes through a decode_* here before anything acts
// on it: it must be at most kMaxInboundBytes (kMaxReplyBytes for replies), parse, carry the
// version this build speaks, have its oneof set, and make sense (a node id a log and a unit
// name can carry, sizes and counts in range, a task whose fields agree with its kind). Each
// failure is one line naming what was wrong, which the caller logs with the peer and drops —
// never an exception, never a half-read message.
//
// The rules live in cluster_codec_core.hpp (which also declares kProtocolVersion, the limits,
// encode and the *_name functions); this header gives them the std::expected API.
#pragma once

#include <expected>
#include <string>
#include <string_view>

#include "common/proto/cluster/cluster.pb.h"
#include "common/proto/cluster/cluster_codec_core.hpp"

namespace thaw::cluster {

std::expected<v1::NodeMessage, std::string> decode_node_message(std::string_view bytes);
std::expected<v1::CoordinatorMessage, std::string> decode_coordinator_message(
    std::string_view bytes);
std::expected<v1::FrontendRequest, std::string> decode_frontend_request(std::string_view bytes);
std::expected<v1::FrontendReply, std::string> decode_frontend_reply(std::string_view bytes);

// The checks decode_* apply, for messages built in memory.
std::expected<void, std::string> validate_node_id(std::string_view id);
std::expected<void, std::string> validate_model_spec(const v1::ModelSpec& spec);
std::expected<void, std::string> validate_task(const v1::Task& task);
std::expected<void, std::string> validate_class_rates(const v1::ClassRates& rates);

}  // namespace thaw::cluster
