// Who sent a D-Bus call, as the message bus recorded it when the caller connected: what
// thawd's mutating methods authorize against.
//
// Not sd-bus's augmented credentials (SD_BUS_CREDS_AUGMENT): those fields are read from
// /proc/<pid> when the call is handled, so they describe whatever process has that pid by
// then — a caller that changed its groups after connecting, or one that exited and whose pid
// was reused. systemd refuses them for authorization for that reason (see
// sd_bus_query_sender_privilege). Without augmentation, sd-bus on dbus-daemon or dbus-broker
// yields only the uid and pid (systemd 252), so the caller's identity comes from the bus's
// own record instead: org.freedesktop.DBus.GetConnectionCredentials, whose UnixUserID and
// UnixGroupIDs (primary and supplementary groups) the bus took from the socket (SO_PEERCRED,
// SO_PEERGROUPS) when the connection was made. The record belongs to the sender's unique name,
// which a bus never gives to another connection.
#pragma once

#include <systemd/sd-bus.h>

#include <expected>
#include <string>

#include "daemon/service/access_policy.hpp"

namespace thaw::daemon {

struct BusCaller {
  PeerIdentity peer;  // uid, pid, and the bus's UnixGroupIDs as `groups` (gid stays unset)
  // False when the bus did not report the caller's groups (a bus older than dbus 1.11, or a
  // caller with more groups than the bus can represent): then only root can be authorized.
  bool groups_known = false;
};

// Asks the bus that delivered `call` for its sender's credentials. The error says why the
// caller could not be identified (no sender, the sender already gone, no uid in the answer).
std::expected<BusCaller, std::string> query_bus_caller(sd_bus_message* call);

}  // namespace thaw::daemon
