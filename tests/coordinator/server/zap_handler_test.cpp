// decide_zap: the ZAP handler's answer for a mechanism and a client key (RFC 27's status
// codes), without sockets.
#include "coordinator/server/zap_handler.hpp"

#include <gtest/gtest.h>
#include <zmq.h>

#include <array>
#include <fstream>

#include "common/zmq/curve_keys.hpp"
#include "temp_dir.hpp"

namespace thaw::coordinator {
namespace {

using thaw::testing::TempDir;

std::string binary_key(const std::string& z85) {
  std::array<std::uint8_t, 32> bytes{};
  EXPECT_NE(zmq_z85_decode(bytes.data(), z85.c_str()), nullptr) << z85;
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

class DecideZap : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = zmqx::generate_key_pair();
    ASSERT_TRUE(pair) << pair.error();
    known_ = pair->public_z85;
    std::ofstream(dir_.path() / "gpu-7.pub") << known_ << "\n";
    auto allow = NodeAllowList::open(dir_.path());
    ASSERT_TRUE(allow) << allow.error();
    allow_ = std::make_unique<NodeAllowList>(std::move(*allow));
    ASSERT_TRUE(allow_->scan().empty());
  }

  TempDir dir_;
  std::string known_;
  std::unique_ptr<NodeAllowList> allow_;
};

TEST_F(DecideZap, OnlyCurveIsAccepted) {
  for (const char* mechanism : {"NULL", "PLAIN", "GSSAPI", "curve", ""}) {
    const ZapDecision d = decide_zap(mechanism, binary_key(known_), *allow_);
    EXPECT_EQ(d.status_code, "400") << mechanism;
    EXPECT_NE(d.status_text.find("only CURVE"), std::string::npos) << d.status_text;
    EXPECT_TRUE(d.user_id.empty());
  }
}

TEST_F(DecideZap, AKeyThatIsNot32BytesIsMalformed) {
  const std::string key = binary_key(known_);
  for (const std::string& bad : {key.substr(0, 31), key + "x", std::string(), known_}) {
    const ZapDecision d = decide_zap("CURVE", bad, *allow_);
    EXPECT_EQ(d.status_code, "400") << bad.size();
    EXPECT_NE(d.status_text.find("malformed"), std::string::npos) << d.status_text;
    EXPECT_TRUE(d.user_id.empty());
  }
}

TEST_F(DecideZap, AnUnknownKeyIsRefusedNamingTheKey) {
  auto stranger = zmqx::generate_key_pair();
  ASSERT_TRUE(stranger) << stranger.error();
  const ZapDecision d = decide_zap("CURVE", binary_key(stranger->public_z85), *allow_);
  EXPECT_EQ(d.status_code, "400");
  EXPECT_NE(d.status_text.find(stranger->public_z85), std::string::npos) << d.status_text;
  EXPECT_NE(d.status_text.find("not on the allow-list"), std::string::npos) << d.status_text;
  EXPECT_TRUE(d.user_id.empty());
}

TEST_F(DecideZap, AKnownKeyIsAdmittedAsItsNode) {
  const ZapDecision d = decide_zap("CURVE", binary_key(known_), *allow_);
  EXPECT_EQ(d.status_code, "200");
  EXPECT_EQ(d.user_id, "gpu-7");
}

}  // namespace
}  // namespace thaw::coordinator
