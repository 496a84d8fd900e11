#include "common/proto/shim_protocol.hpp"

#include <fmt/format.h>

#include <cstring>

namespace thaw::proto {

namespace {

void put_u16(std::byte* p, std::uint16_t v) {
  std::memcpy(p, &v, 2);
}
void put_u32(std::byte* p, std::uint32_t v) {
  std::memcpy(p, &v, 4);
}
std::uint16_t get_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

std::string_view to_string(MessageType type) {
  switch (type) {
    case MessageType::hello:
      return "hello";
    case MessageType::hello_ok:
      return "hello_ok";
    case MessageType::open_file:
      return "open_file";
    case MessageType::file:
      return "file";
    case MessageType::attach_slot:
      return "attach_slot";
    case MessageType::slot:
      return "slot";
    case MessageType::slot_pages:
      return "slot_pages";
    case MessageType::imported:
      return "imported";
    case MessageType::ok:
      return "ok";
    case MessageType::release:
      return "release";
    case MessageType::report_artifact:
      return "report_artifact";
    case MessageType::error:
      return "error";
    case MessageType::get_artifact:
      return "get_artifact";
    case MessageType::artifact:
      return "artifact";
    case MessageType::report_counters:
      return "report_counters";
    case MessageType::export_ipc:
      return "export_ipc";
    case MessageType::import_ipc:
      return "import_ipc";
    case MessageType::ipc:
      return "ipc";
    case MessageType::free_pages:
      return "free_pages";
    case MessageType::lease_memory:
      return "lease_memory";
  }
  return "unknown";
}

bool is_known(std::uint16_t type) {
  return type >= static_cast<std::uint16_t>(MessageType::hello) &&
         type <= static_cast<std::uint16_t>(MessageType::lease_memory);
}

Message reply_to(const Message& request, MessageType type, nlohmann::json body) {
  Message r;
  r.type = type;
  r.request_id = request.request_id;
  r.body = std::move(body);
  return r;
}

std::expected<std::vector<std::byte>, std::string> encode(const Message& message) {
  const std::string payload = message.body.dump();
  if (kHeaderBytes + payload.size() > kMaxMessageBytes) {
    return std::unexpected(fmt::format("{} message of {} bytes exceeds the protocol's {} bytes",
                                       to_string(message.type), kHeaderBytes + payload.size(),
                                       kMaxMessageBytes));
  }
  std::vector<std::byte> out(kHeaderBytes + payload.size());
  put_u32(out.data(), kMagic);
  put_u16(out.data() + 4, message.version);
  put_u16(out.data() + 6, static_cast<std::uint16_t>(message.type));
  put_u32(out.data() + 8, message.request_id);
  put_u32(out.data() + 12, static_cast<std::uint32_t>(payload.size()));
  std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

std::expected<Message, DecodeError> decode(std::span<const std::byte> packet) {
  if (packet.size() > kMaxMessageBytes) {
    return std::unexpected(DecodeError{
        DecodeErrc::too_large,
        fmt::format("message of {} bytes exceeds {} bytes", packet.size(), kMaxMessageBytes)});
  }
  if (packet.size() < kHeaderBytes) {
    return std::unexpected(
        DecodeError{DecodeErrc::short_header,
                    fmt::format("message of {} bytes has no full header", packet.size())});
  }
  if (get_u32(packet.data()) != kMagic) {
    return std::unexpected(DecodeError{DecodeErrc::bad_magic, "message does not start with THAW"});
  }
  Message m;
  m.version = get_u16(packet.data() + 4);
  const std::uint16_t type = get_u16(packet.data() + 6);
  m.request_id = get_u32(packet.data() + 8);
  const std::uint32_t length = get_u32(packet.data() + 12);
  if (length != packet.size() - kHeaderBytes) {
    return std::unexpected(DecodeError{DecodeErrc::bad_length,
                                       fmt::format("header says {} payload bytes, packet has {}",
                                                   length, packet.size() - kHeaderBytes),
                                       m.version});
  }
  if (m.version != kProtocolVersion) return m;  // the caller answers an unknown version
  if (!is_known(type)) {
    return std::unexpected(DecodeError{DecodeErrc::unknown_type,
                                       fmt::format("unknown message type {}", type), m.version});
  }
  m.type = static_cast<MessageType>(type);
  const auto* text = reinterpret_cast<const char*>(packet.data() + kHeaderBytes);
  m.body = nlohmann::json::parse(text, text + length, nullptr, /*allow_exceptions=*/false);
  if (m.body.is_discarded() || !m.body.is_object()) {
    return std::unexpected(
        DecodeError{DecodeErrc::bad_json, "payload is not a JSON object", m.version});
  }
  return m;
}

}  // namespace thaw::proto
