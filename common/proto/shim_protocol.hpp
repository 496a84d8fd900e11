// The shim socket protocol: how an engine's preload shim talks to thawd over
// /run/thaw/thawd.sock (AF_UNIX, SOCK_SEQPACKET: message boundaries kept, descriptors passed
// with SCM_RIGHTS).
//
// Every message is one packet: a 16-byte header, then a JSON object (UTF-8), then nothing.
//
//   u32 magic 'THAW' (0x57414854 little-endian) | u16 version | u16 type |
//   u32 request id (a reply echoes its request's) | u32 payload bytes
//
// Each message is a C++ type (shim_messages.hpp), decoded and checked by one codec that both
// ends use: a body has exactly its type's fields (unknown or missing ones are errors), each
// within its rules, and exactly the descriptors its type carries. thawd takes the peer's
// credentials at accept and decides there whether the allow rule lets it talk: a refused
// peer's first packet gets only its header read (for the request id) and an error
// AccessDenied reply, then the close; nothing it sends is ever JSON-parsed. A packet larger
// than kMaxMessageBytes, a short or inconsistent header, a body the codec refuses, the wrong
// number of descriptors, an unknown type or a reply sent as a request make thawd close that
// connection (and only that one). A version thawd does not speak gets an `error` reply naming
// the version it does, then the connection is closed.
//
// Conversation (client → thawd, thawd → client), protocol version 5:
//   hello {client, engine}                          → hello_ok {protocol, node_id, version}
//                                                     (must come first; refused peers get
//                                                      error AccessDenied and a close)
//   open_file {model, path}                         → file {size, complete} + fds [data,
//                                                      readiness] (the shim uses the data fd
//                                                      to check it is the file it opened)
//   attach_slot {model}                             → slot {slot, token, budget_bytes,
//                                                      resident_bytes, page_bytes, layout_kind
//                                                      ("packed" | "engine"),
//                                                      record_fingerprint, layout_bytes,
//                                                      page_messages} + fd: the layout, a JSON
//                                                      array of [slot_offset, file,
//                                                      file_offset, bytes] rows
//                                                     then page_messages × slot_pages
//                                                      {pages: [slot_offset, ...]} + one fd
//                                                      per page (at most kMaxFdsPerMessage)
//   imported {slot, token}                          → ok {}  (the pages are mapped: unpin)
//   free_pages {slot, offsets: [n, ...]}            → ok {}  (the engine copied those pages'
//                                                      bytes out; thawd frees them; at most
//                                                      kMaxFreePagesPerMessage offsets)
//   lease_memory {gpu_uuid}                         → memory_lease {budget_bytes}  (the pool's
//                                                      free pages, given to the driver for
//                                                      this engine until its connection
//                                                      closes)
//   release {slot, handback}                        → ok {}  (the engine is done with it;
//                                                      handback: it exits normally and the
//                                                      slot may stay prewarmed)
//   report_artifact {kind, identity, bytes} + fd    → ok {}  (the fd: the artifact, a JSON
//                                                      document of `bytes` bytes, e.g. a
//                                                      memfd; kept in thawd's state dir)
//   get_artifact {kind, identity}                   → artifact {bytes} + fd (read-only)
//                                                     or error UnknownArtifact
//   report_counters {counters: {calls_intercepted, deterministic_allocations,
//                    layout_divergences, files_streamed, reads_waited, bytes_streamed,
//                    graph_records_stored, graphs_restored, graph_restore_fallbacks,
//                    kv_restores, kv_restore_fallbacks}}
//                                                   → ok {}  (the shim's totals, at its exit)
//   export_ipc {bytes} + fd                         → ipc_exported {token}  (a POSIX-fd VMM
//                                                      handle shared for CUDA IPC; kept until
//                                                      the exporting connection closes)
//   import_ipc {token}                              → ipc {bytes} + fd
//                                                     or error UnknownIpcHandle
// `kind` of an artifact: "layout", "kvcache" or "graphs". `identity`: {engine, model, gpu,
// driver} (non-empty strings, driver the version).
// Any request may instead get error {name, message} (name: org.thaw.Error.* as on D-Bus).
// When the connection closes, everything the client held is given back.
//
// This header is the frame layer under that codec: a packet as header fields and an untyped
// JSON body. Tests and tools use it to send what the typed codec would refuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/proto/shim_messages.hpp"

namespace thaw::proto {

// A packet of the frame layer: the header's fields and the body as JSON, unchecked.
struct Message {
  std::uint16_t version = kProtocolVersion;
  MessageType type = MessageType::ok;
  std::uint32_t request_id = 0;
  nlohmann::json body = nlohmann::json::object();
};

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
