#include "common/proto/shim_protocol.hpp"

#include <fmt/format.h>

#include <cstring>

namespace thaw::proto {

std::expected<std::vector<std::byte>, std::string> encode(const Message& message) {
  const std::string payload =
      message.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (kHeaderBytes + payload.size() > kMaxMessageBytes) {
    return std::unexpected(fmt::format("{} message of {} bytes exceeds the protocol's {} bytes",
                                       to_string(message.type), kHeaderBytes + payload.size(),
                                       kMaxMessageBytes));
  }
  std::vector<std::byte> out(kHeaderBytes + payload.size());
  write_frame_header(FrameHeader{message.version, static_cast<std::uint16_t>(message.type),
                                 message.request_id, static_cast<std::uint32_t>(payload.size())},
                     out.data());
  std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

std::expected<Message, DecodeError> decode(std::span<const std::byte> packet) {
  FrameHeader header;
  FrameErrc frame = FrameErrc::none;
  if (auto e = read_frame_header(packet, header, frame); !e.empty()) {
    DecodeErrc code = DecodeErrc::bad_length;
    switch (frame) {
      case FrameErrc::too_large:
        code = DecodeErrc::too_large;
        break;
      case FrameErrc::short_header:
        code = DecodeErrc::short_header;
        break;
      case FrameErrc::bad_magic:
        code = DecodeErrc::bad_magic;
        break;
      default:
        break;
    }
    return std::unexpected(DecodeError{code, std::move(e), header.version});
  }
  Message m;
  m.version = header.version;
  m.request_id = header.request_id;
  if (m.version != kProtocolVersion) return m;  // the caller answers an unknown version
  if (!is_known(header.type)) {
    return std::unexpected(DecodeError{
        DecodeErrc::unknown_type, fmt::format("unknown message type {}", header.type), m.version});
  }
  m.type = static_cast<MessageType>(header.type);
  const auto* text = reinterpret_cast<const char*>(packet.data() + kHeaderBytes);
  m.body = nlohmann::json::parse(text, text + header.length, nullptr, /*allow_exceptions=*/false);
  if (m.body.is_discarded() || !m.body.is_object()) {
    return std::unexpected(
        DecodeError{DecodeErrc::bad_json, "payload is not a JSON object", m.version});
  }
  return m;
}

}  // namespace thaw::proto
