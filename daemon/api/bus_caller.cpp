#include "daemon/api/bus_caller.hpp"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <string_view>

namespace thaw::daemon {

namespace {

struct MessageUnref {
  void operator()(sd_bus_message* m) const { sd_bus_message_unref(m); }
};
using MessagePtr = std::unique_ptr<sd_bus_message, MessageUnref>;

std::string parse_error(int r) {
  return fmt::format("the bus's GetConnectionCredentials answer is malformed ({})",
                     std::strerror(-r));
}

// Reads one a{sv} entry's value into `caller`; keys thawd does not use are skipped.
int read_entry(sd_bus_message* reply, std::string_view key, BusCaller& caller, bool& have_uid) {
  if (key == "UnixUserID") {
    uint32_t uid = 0;
    const int r = sd_bus_message_read(reply, "v", "u", &uid);
    if (r >= 0) {
      caller.peer.uid = static_cast<uid_t>(uid);
      have_uid = true;
    }
    return r;
  }
  if (key == "ProcessID") {
    uint32_t pid = 0;
    const int r = sd_bus_message_read(reply, "v", "u", &pid);
    if (r >= 0) caller.peer.pid = static_cast<pid_t>(pid);
    return r;
  }
  if (key == "UnixGroupIDs") {
    int r = sd_bus_message_enter_container(reply, 'v', "au");
    if (r < 0) return r;
    const void* data = nullptr;
    size_t size = 0;
    if ((r = sd_bus_message_read_array(reply, 'u', &data, &size)) < 0) return r;
    const auto* gids = static_cast<const uint32_t*>(data);
    caller.peer.groups.assign(gids, gids + size / sizeof(uint32_t));
    caller.groups_known = true;
    return sd_bus_message_exit_container(reply);
  }
  return sd_bus_message_skip(reply, "v");
}

}  // namespace

std::expected<BusCaller, std::string> query_bus_caller(sd_bus_message* call) {
  // The bus fills in the sender field itself, always with the unique name; a call without one
  // came over a direct connection, which thawd does not serve.
  const char* sender = sd_bus_message_get_sender(call);
  if (sender == nullptr || sender[0] != ':') {
    return std::unexpected(std::string("the call did not come through a message bus"));
  }
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* raw = nullptr;
  const int called = sd_bus_call_method(sd_bus_message_get_bus(call), "org.freedesktop.DBus",
                                        "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                        "GetConnectionCredentials", &error, &raw, "s", sender);
  MessagePtr reply(raw);
  if (called < 0) {
    std::string why =
        fmt::format("asking the bus for {}'s credentials failed: {}", sender,
                    error.message != nullptr ? error.message : std::strerror(-called));
    sd_bus_error_free(&error);
    return std::unexpected(std::move(why));
  }
  BusCaller caller;
  bool have_uid = false;
  int r = sd_bus_message_enter_container(reply.get(), 'a', "{sv}");
  if (r < 0) return std::unexpected(parse_error(r));
  while ((r = sd_bus_message_enter_container(reply.get(), 'e', "sv")) > 0) {
    const char* key = nullptr;
    if ((r = sd_bus_message_read(reply.get(), "s", &key)) < 0 ||
        (r = read_entry(reply.get(), key, caller, have_uid)) < 0 ||
        (r = sd_bus_message_exit_container(reply.get())) < 0) {
      return std::unexpected(parse_error(r));
    }
  }
  if (r < 0) return std::unexpected(parse_error(r));
  if (!have_uid) {
    return std::unexpected(fmt::format("the bus did not say which user {} runs as", sender));
  }
  return caller;
}

}  // namespace thaw::daemon
