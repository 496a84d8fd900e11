// Decoding and validation of the control plane's messages (cluster.proto), for both ends.
//
// Every byte string that crosses a socket goes through a decode_* here before anything acts
// on it: it must parse, carry the version this build speaks, have its oneof set, and make
// sense (a node id a log and a unit name can carry, sizes and counts in range, a task whose
// fields agree with its kind). Each failure is a message naming what was wrong, which the
// caller logs with the peer and drops — never an exception, never a half-read message.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

#include "common/proto/cluster/cluster.pb.h"

namespace thaw::cluster {

inline constexpr std::uint32_t kProtocolVersion = 1;
// Larger messages are refused before parsing (a Register of a node with many cached models
// and slots is a few KiB; ClusterState replies go the other way and are not limited here).
inline constexpr std::size_t kMaxInboundBytes = 1u << 20;

std::expected<v1::NodeMessage, std::string> decode_node_message(std::string_view bytes);
std::expected<v1::CoordinatorMessage, std::string> decode_coordinator_message(
    std::string_view bytes);
std::expected<v1::FrontendRequest, std::string> decode_frontend_request(std::string_view bytes);
std::expected<v1::FrontendReply, std::string> decode_frontend_reply(std::string_view bytes);

// The checks decode_* apply, for messages built in memory.
std::expected<void, std::string> validate_node_id(std::string_view id);
std::expected<void, std::string> validate_model_spec(const v1::ModelSpec& spec);
std::expected<void, std::string> validate_task(const v1::Task& task);

// Sets `version` and serialises.
std::string encode(v1::NodeMessage message);
std::string encode(v1::CoordinatorMessage message);
std::string encode(v1::FrontendRequest message);
std::string encode(v1::FrontendReply message);

std::string_view task_kind_name(v1::TaskKind kind);
std::string_view task_state_name(v1::TaskState state);

}  // namespace thaw::cluster
