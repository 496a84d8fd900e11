// The access rule: root always; others only through a primary or supplementary group that
// is allowed; group names that do not exist are reported, never matched.
#include "daemon/service/access_policy.hpp"

#include <grp.h>
#include <gtest/gtest.h>

namespace {

using thaw::daemon::AccessPolicy;
using thaw::daemon::PeerIdentity;

gid_t gid_of(const char* name) {
  const group* g = ::getgrnam(name);
  return g != nullptr ? g->gr_gid : static_cast<gid_t>(-1);
}

TEST(AccessPolicy, RootIsAlwaysAllowed) {
  AccessPolicy none({});
  EXPECT_TRUE(none.allows(PeerIdentity{1, 0, 0, {}}));
  EXPECT_FALSE(none.allows(PeerIdentity{1, 1000, 1000, {}}));
  EXPECT_EQ(none.describe(), "root");
}

TEST(AccessPolicy, PrimaryOrSupplementaryGroupAllows) {
  // "users" (gid 100) and "nogroup" exist on every Debian system.
  const gid_t users = gid_of("users");
  ASSERT_NE(users, static_cast<gid_t>(-1));
  AccessPolicy policy({"users"});
  EXPECT_TRUE(policy.allows(PeerIdentity{1, 1000, users, {}}));
  EXPECT_TRUE(policy.allows(PeerIdentity{1, 1000, 1000, {4, users}}));
  EXPECT_FALSE(policy.allows(PeerIdentity{1, 1000, 1000, {4, 24}}));
  EXPECT_EQ(policy.describe(), "root or group users");
}

TEST(AccessPolicy, UnknownGroupsAreReportedAndMatchNothing) {
  AccessPolicy policy({"no-such-group-thaw-test", "users"});
  ASSERT_EQ(policy.unknown_groups().size(), 1u);
  EXPECT_EQ(policy.unknown_groups()[0], "no-such-group-thaw-test");
  EXPECT_FALSE(policy.allows(PeerIdentity{1, 1000, static_cast<gid_t>(-1), {}}));
}

}  // namespace
