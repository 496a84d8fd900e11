// The shim socket protocol: how an engine's preload shim talks to thawd over
// /run/thaw/thawd.sock (AF_UNIX, SOCK_SEQPACKET: message boundaries kept, descriptors passed
// with SCM_RIGHTS).
//
// Every message is one packet: a 16-byte header, then a JSON object (UTF-8), then nothing.
//
//   u32 magic 'THAW' (0x57414854 little-endian) | u16 version | u16 type |
//   u32 request id (a reply echoes its request's) | u32 payload bytes
//
// A packet larger than kMaxMessageBytes, a short or inconsistent header, a payload that is
// not a JSON object, more descriptors than a message may carry or an unknown type make
// thawd close that connection (and only that one). A version thawd does not speak gets
// an `error` reply naming the versions it does, then the connection is closed.
//
// Conversation (client → thawd, thawd → client):
//   hello {client, engine, fingerprint, pid}        → hello_ok {protocol, node_id, version}
//                                                     (must come first; refused peers get
//                                                      error AccessDenied and a close)
//   open_file {model, path}                         → file {size, chunk_size, chunk_count,
//                                                      complete} + fds [data, readiness]
//   attach_slot {model}                             → slot {slot, gpu, weight_bytes, token,
//                                                      budget_bytes, resident_bytes,
//                                                      page_bytes, layout_kind ("packed" |
//                                                      "engine"), record_fingerprint,
//                                                      layout_bytes, page_messages} + fd: the
//                                                      layout, a JSON array of [slot_offset,
//                                                      file, file_offset, bytes, layer] rows
//                                                     then page_messages × slot_pages
//                                                      {pages: [{slot_offset, bytes}]} + one
//                                                      fd per page (at most kMaxFdsPerMessage)
//   imported {slot, token}                          → ok   (the pages are mapped: unpin)
//   free_pages {slot, offsets: [n, ...]}            → ok {freed}  (the engine copied those
//                                                      pages' bytes out; thawd frees them)
//   lease_memory {gpu_uuid}                         → ok {gpu, budget_bytes}  (the pool's free
//                                                      pages, given to the driver for this
//                                                      engine until its connection closes)
//   release {slot, handback}                        → ok   (the engine is done with it;
//                                                      handback: it exits normally and the
//                                                      slot may stay prewarmed)
//   report_artifact {kind, identity, bytes} + fd    → ok {key}  (the fd: the artifact, a JSON
//                                                      document of `bytes` bytes, e.g. a
//                                                      memfd; kept in thawd's state dir)
//   get_artifact {kind, identity}                   → artifact {key, bytes} + fd (read-only)
//                                                     or error UnknownArtifact
//   report_counters {counters: {name: n, ...}}      → ok   (the shim's totals, at its exit)
//   export_ipc {bytes} + fd                         → ok {token}  (a POSIX-fd VMM handle
//                                                      shared for CUDA IPC; kept until the
//                                                      exporting connection closes)
//   import_ipc {token}                              → ipc {bytes} + fd
//                                                     or error UnknownIpcHandle
// `identity` of an artifact: {engine, model, gpu, driver} (strings, driver the version).
// Any request may instead get error {name, message} (name: org.thaw.Error.* as on D-Bus).
// When the connection closes, everything the client held is given back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace thaw::proto {

inline constexpr std::uint32_t kMagic = 0x57414854;  // "THAW" in memory order
inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::size_t kHeaderBytes = 16;
inline constexpr std::size_t kMaxMessageBytes = 64 * 1024;
inline constexpr std::size_t kMaxFdsPerMessage = 128;  // below the kernel's SCM_MAX_FD (253)

enum class MessageType : std::uint16_t {
  hello = 1,
  hello_ok = 2,
  open_file = 3,
  file = 4,
  attach_slot = 5,
  slot = 6,
  slot_pages = 7,
  imported = 8,
  ok = 9,
  release = 10,
  report_artifact = 11,
  error = 12,
  get_artifact = 13,
  artifact = 14,
  report_counters = 15,
  export_ipc = 16,
  import_ipc = 17,
  ipc = 18,
  free_pages = 19,
  lease_memory = 20,
};
std::string_view to_string(MessageType type);
bool is_known(std::uint16_t type);

struct Message {
  std::uint16_t version = kProtocolVersion;
  MessageType type = MessageType::ok;
  std::uint32_t request_id = 0;
  nlohmann::json body = nlohmann::json::object();
};

// The reply to `request`: its request id, `type`, `body`.
Message reply_to(const Message& request, MessageType type, nlohmann::json body);

// Header + payload bytes. Fails if the payload would exceed kMaxMessageBytes.
std::expected<std::vector<std::byte>, std::string> encode(const Message& message);

enum class DecodeErrc { short_header, bad_magic, bad_length, unknown_type, bad_json, too_large };
struct DecodeError {
  DecodeErrc code;
  std::string message;
  std::uint16_t version = 0;  // the header's, when it could be read
};
// Parses one packet. A version other than kProtocolVersion is returned as is (the caller
// answers it); everything else malformed is an error.
std::expected<Message, DecodeError> decode(std::span<const std::byte> packet);

}  // namespace thaw::proto
