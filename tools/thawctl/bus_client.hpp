// thawctl's view of thawd's D-Bus API: connect, read an object's properties (GetAll, as
// JSON), call a Manager method. Failures throw Failure with a message for the user and
// the exit code it maps to.
#pragma once

#include <systemd/sd-bus.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace thawctl {

inline constexpr const char* kService = "org.thaw.Node1";
inline constexpr const char* kManagerPath = "/org/thaw/Node1";
inline constexpr const char* kManager = "org.thaw.Node1.Manager";

// Exit codes, for scripts.
inline constexpr int kExitOk = 0;
inline constexpr int kExitThawd = 1;    // thawd unreachable, or it refused the request
inline constexpr int kExitUsage = 2;    // bad command line
inline constexpr int kExitFailed = 3;   // the fetch or prewarm ran and failed
inline constexpr int kExitTimeout = 4;  // wait/--timeout passed first

struct Failure {
  std::string message;
  int exit_code = kExitThawd;
  std::string error_name;  // the D-Bus error name, when thawd answered with one
};
[[noreturn]] void fail(std::string message, int exit_code = kExitThawd);

struct BusUnref {
  void operator()(sd_bus* b) const { sd_bus_flush_close_unref(b); }
};
using Bus = std::unique_ptr<sd_bus, BusUnref>;

Bus connect(const std::string& which);

// Every property of `interface` at `path`, as a JSON object (names as on the bus).
nlohmann::json get_all(sd_bus* bus, const std::string& path, const char* interface);
// The same, or nullopt when the object is gone (a slot reaped or a model evicted between a
// listing and this read: not an error of the command that asked).
std::optional<nlohmann::json> get_all_if_present(sd_bus* bus, const std::string& path,
                                                 const char* interface);

struct MessageUnref {
  void operator()(sd_bus_message* m) const { sd_bus_message_unref(m); }
};
using Reply = std::unique_ptr<sd_bus_message, MessageUnref>;

// Calls a Manager method; `fill` appends the arguments to the message.
Reply call(sd_bus* bus, const char* method, const std::function<int(sd_bus_message*)>& fill);

}  // namespace thawctl
