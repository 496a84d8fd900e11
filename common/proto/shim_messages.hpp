// The shim socket's messages as C++ types, and the one codec both ends use: thawd's shim
// server (daemon/shim_socket) and the preload shim's client (preload/thawd_client).
//
// A packet is a 16-byte header (shim_protocol.hpp documents it and the conversation) and a
// JSON object. decode_message takes a packet and the descriptors that came with it and
// either returns one of the structs below, every field checked, or says in one printable
// line what was wrong — never an exception, never a half-read message:
//   - the packet: at most kMaxMessageBytes, a whole header, magic, length, this version, a
//     known type;
//   - the body: a JSON object with exactly the fields of its type (an unknown or a missing
//     field is an error: both ends speak exactly kProtocolVersion, so a new field is a new
//     version, not something to guess about), each of its JSON type, strings within their
//     length and character rules, numbers within their range, enums one of their names;
//   - the descriptors: exactly as many as the type carries (none, one, two, or one per page
//     of a slot_pages), moved into the struct's UniqueFd members.
// Encoding applies the same rules, so what one end sends the other accepts.
//
// This core reports errors as strings ("" = valid) with the result through an out-parameter,
// not std::expected, so that it also builds with clang 14 + libstdc++ 12 (the libFuzzer build
// in tests/fuzz), which lacks <expected>; shim_protocol.hpp and seqpacket.hpp give it the
// std::expected API the rest of thaw uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/layout/layout_kind.hpp"

namespace thaw::proto {

inline constexpr std::uint32_t kMagic = 0x57414854;  // "THAW" in memory order
// 2: typed bodies (exact field sets), hello without pid, file without chunk_size and
// chunk_count, slot without gpu and weight_bytes, 4-field layout rows, slot_pages as a list
// of offsets, replies of their own type for lease_memory and export_ipc.
// 3: artifact kind "kvcache" (an engine's KV-cache sizing, preload/restore).
// 4: artifact kind "graphs" (the CUDA graphs an engine captured, preload/artifact).
// 5: report_counters carries the restores' counters (graph records stored, graphs restored
//    and graph restore fallbacks, KV-cache restores and fallbacks).
inline constexpr std::uint16_t kProtocolVersion = 5;
inline constexpr std::size_t kHeaderBytes = 16;
inline constexpr std::size_t kMaxMessageBytes = 64 * 1024;
inline constexpr std::size_t kMaxFdsPerMessage = 128;  // below the kernel's SCM_MAX_FD (253)

// Field limits (decode_message refuses what exceeds them).
inline constexpr std::size_t kMaxNameBytes = 256;       // model keys, slots, client, node id...
inline constexpr std::size_t kMaxTextBytes = 4096;      // paths, an engine fingerprint, messages
inline constexpr std::uint64_t kMaxBytes = 1ull << 50;  // any size in bytes: 1 PiB
inline constexpr std::uint64_t kMaxDocumentBytes = 1ull << 30;  // an artifact or a layout
inline constexpr std::uint64_t kMaxCounter = 1ull << 53;        // exact in a double
inline constexpr std::uint32_t kMaxPageMessages = 1u << 16;
// free_pages offsets per message: 2048 offsets of up to 20 digits fit kMaxMessageBytes.
inline constexpr std::size_t kMaxFreePagesPerMessage = 2048;
inline constexpr std::size_t kMaxLayoutRows = 1u << 20;

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
  memory_lease = 21,
  ipc_exported = 22,
};
std::string_view to_string(MessageType type);
bool is_known(std::uint16_t type);

// ---- The header ----

struct FrameHeader {
  std::uint16_t version = 0;
  std::uint16_t type = 0;  // not yet known to be a MessageType
  std::uint32_t request_id = 0;
  std::uint32_t length = 0;  // payload bytes
};
enum class FrameErrc { none, too_large, short_header, bad_magic, bad_length };
// Reads the header of one packet and checks that the packet is exactly one frame (size limit,
// magic, length). No byte of the payload is looked at: thawd does this much for a peer it
// refuses, to answer it. "" when valid.
std::string read_frame_header(std::span<const std::byte> packet, FrameHeader& out, FrameErrc& code);
// The 16 header bytes for a payload of `length` bytes.
void write_frame_header(const FrameHeader& header, std::byte* out);

// ---- Message bodies ----

// How a prewarmed slot lays out the model's bytes (common/layout/layout_kind.hpp): the one
// type thawd's slots, this message and the shim's grant share; text only in the JSON body.
using layout::LayoutKind;

// What a recorded artifact is: the deterministic layout's record, the KV-cache sizing an
// engine reported through the restore ABI (preload/restore), or the CUDA graphs it captured
// (common/graphs, recorded by preload/artifact). New kinds are a new protocol version.
enum class ArtifactKind : std::uint8_t { layout, kvcache, graphs };
std::string_view to_string(ArtifactKind kind);

struct ArtifactIdentity {
  std::string engine;  // engine fingerprint (up to kMaxTextBytes)
  std::string model;   // cache key
  std::string gpu;     // device name
  std::string driver;  // cuDriverGetVersion as a string
};

// The shim's totals, reported at its exit and summed by thawd (its metrics). One struct on
// both ends: preload/shim's ShimCounters fills it, daemon/shim_socket adds it up
// (ShimSocketCounters).
struct EngineCounters {
  std::uint64_t calls_intercepted = 0;
  std::uint64_t deterministic_allocations = 0;
  std::uint64_t layout_divergences = 0;
  std::uint64_t files_streamed = 0;
  std::uint64_t reads_waited = 0;
  std::uint64_t bytes_streamed = 0;
  // Since version 5: what the run's restores did (0 where the shim has no such restore yet).
  std::uint64_t graph_records_stored = 0;     // "graphs" artifacts thawd took (0 or 1 a run)
  std::uint64_t graphs_restored = 0;          // graphs given from a record instead of captured
  std::uint64_t graph_restore_fallbacks = 0;  // asked for, not restorable: captured after all
  std::uint64_t kv_restores = 0;              // KV-cache lookups answered with a record's size
  std::uint64_t kv_restore_fallbacks = 0;     // lookups answered otherwise (none, stale,
                                              // corrupt, unavailable): the engine profiles
};

// One row of a slot's layout: `bytes` bytes of model file `file` from `file_offset` lie at
// `slot_offset` from the slot's base. On the wire (the layout document): [slot_offset, file,
// file_offset, bytes].
struct LayoutRow {
  std::uint64_t slot_offset = 0;
  std::string file;
  std::uint64_t file_offset = 0;
  std::uint64_t bytes = 0;
};

// client → thawd. Must come first.
struct Hello {
  static constexpr MessageType kType = MessageType::hello;
  std::string client;  // "thaw-preload", a test's or a tool's name (any characters: logged
  std::string engine;  // quoted) and the program's name, for thawd's log (may be empty)
};
struct HelloOk {
  static constexpr MessageType kType = MessageType::hello_ok;
  std::uint16_t protocol = kProtocolVersion;
  std::string node_id;
  std::string version;  // thawd's release
};
struct OpenFile {
  static constexpr MessageType kType = MessageType::open_file;
  std::string model;  // cache key
  std::string path;   // relative to the model's directory
};
// Carries two descriptors: the cached file (read-only; the shim checks it is the file the
// engine opened) and its readiness map.
struct File {
  static constexpr MessageType kType = MessageType::file;
  std::uint64_t size = 0;
  bool complete = false;
  UniqueFd data;
  UniqueFd readiness;
};
struct AttachSlot {
  static constexpr MessageType kType = MessageType::attach_slot;
  std::string model;
};
// Carries one descriptor: the layout document (layout_bytes bytes, encode_slot_layout), a
// memfd because a big model's layout exceeds a message. page_messages slot_pages follow.
struct Slot {
  static constexpr MessageType kType = MessageType::slot;
  std::string slot;
  std::uint64_t token = 0;  // for `imported`
  std::uint64_t budget_bytes = 0;
  std::uint64_t resident_bytes = 0;  // prefix of the layout whose bytes are in the pages
  std::uint64_t page_bytes = 0;      // a power of two
  LayoutKind layout_kind = LayoutKind::packed;
  std::string record_fingerprint;  // engine layout: the record it was built from ("" packed)
  std::uint64_t layout_bytes = 0;
  std::uint32_t page_messages = 0;
  UniqueFd layout;
};
// Carries one descriptor per page (1 to kMaxFdsPerMessage), in the order of `offsets`.
struct SlotPages {
  static constexpr MessageType kType = MessageType::slot_pages;
  std::vector<std::uint64_t> offsets;  // each page's offset from the slot's base
  std::vector<UniqueFd> pages;
};
struct Imported {
  static constexpr MessageType kType = MessageType::imported;
  std::string slot;
  std::uint64_t token = 0;
};
struct Ok {
  static constexpr MessageType kType = MessageType::ok;
};
struct Release {
  static constexpr MessageType kType = MessageType::release;
  std::string slot;
  bool handback = false;  // the engine exits normally; the slot may stay prewarmed
};
// Carries one descriptor: the artifact document (`bytes` bytes, e.g. a memfd).
struct ReportArtifact {
  static constexpr MessageType kType = MessageType::report_artifact;
  ArtifactKind kind = ArtifactKind::layout;
  ArtifactIdentity identity;
  std::uint64_t bytes = 0;  // 1 to kMaxDocumentBytes
  UniqueFd document;
};
struct Error {
  static constexpr MessageType kType = MessageType::error;
  std::string name;     // org.thaw.Error.* (as on D-Bus): letters, digits, '.', '_'
  std::string message;  // one printable line, up to kMaxTextBytes
  // An error whose message is made to fit: control characters replaced, cut to
  // kMaxTextBytes. What thawd answers with, so that a reply never fails to encode.
  static Error make(std::string name, std::string_view message);
};
struct GetArtifact {
  static constexpr MessageType kType = MessageType::get_artifact;
  ArtifactKind kind = ArtifactKind::layout;
  ArtifactIdentity identity;
};
// Carries one descriptor: the document (read-only), `bytes` bytes.
struct Artifact {
  static constexpr MessageType kType = MessageType::artifact;
  std::uint64_t bytes = 0;
  UniqueFd document;
};
struct ReportCounters {
  static constexpr MessageType kType = MessageType::report_counters;
  EngineCounters counters;  // each at most kMaxCounter
};
// Carries one descriptor: a POSIX-fd VMM handle of `bytes` bytes.
struct ExportIpc {
  static constexpr MessageType kType = MessageType::export_ipc;
  std::uint64_t bytes = 0;
  UniqueFd handle;
};
struct IpcExported {
  static constexpr MessageType kType = MessageType::ipc_exported;
  std::uint64_t token = 0;
};
struct ImportIpc {
  static constexpr MessageType kType = MessageType::import_ipc;
  std::uint64_t token = 0;
};
// Carries one descriptor: the exported handle; `bytes` as exported (the shim checks it
// against the size its IPC handle names).
struct Ipc {
  static constexpr MessageType kType = MessageType::ipc;
  std::uint64_t bytes = 0;
  UniqueFd handle;
};
struct FreePages {
  static constexpr MessageType kType = MessageType::free_pages;
  std::string slot;
  std::vector<std::uint64_t> offsets;  // 1 to kMaxFreePagesPerMessage
};
struct LeaseMemory {
  static constexpr MessageType kType = MessageType::lease_memory;
  std::string gpu_uuid;  // 32 hex digits
};
struct MemoryLease {
  static constexpr MessageType kType = MessageType::memory_lease;
  std::uint64_t budget_bytes = 0;
};

// Every message; the alternative is the type (each struct's kType).
// (In MessageType order: the codec indexes its decoders by type.)
using ShimMessage =
    std::variant<Hello, HelloOk, OpenFile, File, AttachSlot, Slot, SlotPages, Imported, Ok, Release,
                 ReportArtifact, Error, GetArtifact, Artifact, ReportCounters, ExportIpc, ImportIpc,
                 Ipc, FreePages, LeaseMemory, MemoryLease, IpcExported>;
MessageType type_of(const ShimMessage& message);

// A message and the request id of its packet (a reply echoes its request's).
struct Envelope {
  std::uint32_t request_id = 0;
  ShimMessage message;
};

// ---- The codec ----

// Decodes one packet and the descriptors that came with it. "" and `out` set, or why not
// (then the descriptors are closed). A packet of another version is an error here: a server
// that answers other versions checks read_frame_header's version first. `value_error`, when
// given, is set when the only thing wrong is a number out of its range in a body that is
// otherwise well formed: thawd answers that one (InvalidArgument) and keeps the connection,
// while anything else means the peer does not speak the protocol and is disconnected.
std::string decode_message(std::span<const std::byte> packet, std::vector<UniqueFd> fds,
                           Envelope& out, bool* value_error = nullptr);

// Encodes `message` as one packet (`bytes`) and the descriptors it carries (`fds`, borrowed
// from the message: keep it alive until sent). "" when done, else why not (a field breaks
// its rule, or the packet would exceed kMaxMessageBytes).
std::string encode_message(std::uint32_t request_id, const ShimMessage& message,
                           std::vector<std::byte>& bytes, std::vector<int>& fds);

// A slot's layout document (Slot::layout): a JSON array of [slot_offset, file, file_offset,
// bytes] rows, at most kMaxLayoutRows, each file a relative path. "" when done.
std::string encode_slot_layout(const std::vector<LayoutRow>& rows, std::string& text);
std::string decode_slot_layout(std::string_view text, std::vector<LayoutRow>& out);

// `s` for an error message: in double quotes, bytes outside printable ASCII and quotes
// escaped as \xNN, cut to 64 bytes (then "...").
std::string quoted(std::string_view s);
// `s` for a log line: the same escapes, no quotes, cut to `shown` bytes (then "...").
std::string printable(std::string_view s, std::size_t shown = kMaxNameBytes);

}  // namespace thaw::proto
