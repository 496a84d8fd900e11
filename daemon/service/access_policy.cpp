#include "daemon/service/access_policy.hpp"

#include <fmt/format.h>
#include <grp.h>

#include <algorithm>

namespace thaw::daemon {

AccessPolicy::AccessPolicy(const std::vector<std::string>& allow_groups) : names_(allow_groups) {
  for (const std::string& name : allow_groups) {
    // getgrnam_r with a buffer that grows: groups with many members have long entries.
    std::vector<char> buffer(4096);
    for (;;) {
      group entry{};
      group* found = nullptr;
      const int rc = ::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
      if (rc == ERANGE && buffer.size() < (1u << 20)) {
        buffer.resize(buffer.size() * 2);
        continue;
      }
      if (rc == 0 && found != nullptr) {
        gids_.push_back(found->gr_gid);
      } else {
        unknown_.push_back(name);
      }
      break;
    }
  }
}

bool AccessPolicy::allows(const PeerIdentity& peer) const {
  if (peer.uid == 0) return true;
  auto allowed = [&](gid_t g) { return std::ranges::find(gids_, g) != gids_.end(); };
  return allowed(peer.gid) || std::ranges::any_of(peer.groups, allowed);
}

std::string AccessPolicy::describe() const {
  if (names_.empty()) return "root";
  return fmt::format("root or group {}", fmt::join(names_, " or "));
}

}  // namespace thaw::daemon
