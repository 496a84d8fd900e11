// The shim protocol's framing: round trips, and every malformed packet refused with a
// reason (a decode error closes the connection in thawd, so none may slip through).
#include "common/proto/shim_protocol.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace {

using namespace thaw::proto;

TEST(ShimProtocol, RoundTripsAMessage) {
  Message m;
  m.type = MessageType::open_file;
  m.request_id = 77;
  m.body = {{"model", "gpt2"}, {"path", "model.safetensors"}};
  auto bytes = encode(m);
  ASSERT_TRUE(bytes);
  auto back = decode(*bytes);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->type, MessageType::open_file);
  EXPECT_EQ(back->request_id, 77u);
  EXPECT_EQ(back->version, kProtocolVersion);
  EXPECT_EQ(back->body, m.body);
}

TEST(ShimProtocol, RefusesMalformedPackets) {
  Message m;
  m.type = MessageType::hello;
  auto good = *encode(m);
  auto expect = [](std::vector<std::byte> packet, DecodeErrc code) {
    auto r = decode(packet);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, code) << r.error().message;
    EXPECT_FALSE(r.error().message.empty());
  };
  expect(std::vector<std::byte>(good.begin(), good.begin() + 10), DecodeErrc::short_header);
  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  expect(bad_magic, DecodeErrc::bad_magic);
  auto long_claim = good;
  long_claim[12] = std::byte{0xff};
  expect(long_claim, DecodeErrc::bad_length);
  auto unknown = good;
  unknown[6] = std::byte{99};
  expect(unknown, DecodeErrc::unknown_type);
  auto not_object = good;
  not_object.resize(kHeaderBytes);
  const std::string array = "[1,2]";
  for (char c : array) not_object.push_back(static_cast<std::byte>(c));
  const auto n = static_cast<std::uint32_t>(array.size());
  std::memcpy(not_object.data() + 12, &n, 4);
  expect(not_object, DecodeErrc::bad_json);
  expect(std::vector<std::byte>(kMaxMessageBytes + 1), DecodeErrc::too_large);
}

TEST(ShimProtocol, AnotherVersionIsReturnedForTheCallerToAnswer) {
  Message m;
  m.version = 7;
  m.type = MessageType::hello;
  auto back = decode(*encode(m));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->version, 7);
}

TEST(ShimProtocol, EncodeRefusesBodiesOverTheLimit) {
  Message m;
  m.body = {{"blob", std::string(kMaxMessageBytes, 'a')}};
  EXPECT_FALSE(encode(m));
}

}  // namespace
