// Who may change what thawd holds: root, or a member (primary or supplementary) of one of
// the configured groups (shim.allow_groups, "thaw" by default). The bus policy file already
// keeps others from calling mutating D-Bus methods; thawd checks again itself, from the
// credentials the bus (or SO_PEERCRED/SO_PEERGROUPS on the shim socket) vouches for, so a
// permissive bus configuration cannot open it up.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace thaw::daemon {

struct PeerIdentity {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  // Supplementary groups. From the bus (GetConnectionCredentials' UnixGroupIDs) every group,
  // the primary one included, with `gid` unset: the bus does not say which is primary.
  std::vector<gid_t> groups;
};

class AccessPolicy {
 public:
  // Group names are resolved now (getgrnam); names that do not exist are skipped, and
  // listed by unknown_groups() so thawd can warn about them.
  explicit AccessPolicy(const std::vector<std::string>& allow_groups);

  bool allows(const PeerIdentity& peer) const;
  const std::vector<std::string>& unknown_groups() const { return unknown_; }
  // "root or group thaw", for error messages.
  std::string describe() const;

 private:
  std::vector<gid_t> gids_;
  std::vector<std::string> names_;
  std::vector<std::string> unknown_;
};

}  // namespace thaw::daemon
