// Shared by the thawd suites: a test-owned NOTIFY_SOCKET, a private dbus-daemon (open, or
// with the system bus's default policy plus the shipped packaging/org.thaw.Node1.conf),
// running real programs (busctl, dbus-send, thawctl, setpriv), and thawd itself.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace thaw::testing {

// A datagram socket standing in for systemd's notification socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::filesystem::path& path);
  ~NotifySocket();
  // The next datagram, or "" after `timeout`.
  std::string next(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Datagrams until one contains `what` (inclusive); empty vector on timeout.
  std::vector<std::string> until(const std::string& what);

 private:
  int fd_ = -1;
};

enum class BusPolicy {
  open,     // anyone may do anything (tests of thawd's own checks)
  shipped,  // the system bus's default policy + packaging/org.thaw.Node1.conf
};

// A private dbus-daemon listening on `dir`/bus.
class PrivateBus {
 public:
  PrivateBus(const std::filesystem::path& dir, BusPolicy policy = BusPolicy::open);
  ~PrivateBus();
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  pid_t pid_ = -1;
};

struct ProgramResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs argv (argv[0] a path), waits for it.
ProgramResult run(const std::vector<std::string>& argv);
// busctl --address=ADDRESS args...
ProgramResult busctl(const std::string& address, const std::vector<std::string>& args);
// The same as user nobody (uid/gid 65534, no supplementary groups), through setpriv.
ProgramResult busctl_as_nobody(const std::string& address, const std::vector<std::string>& args);
// dbus-send --print-reply (prints the D-Bus error name on failure).
ProgramResult dbus_send(const std::string& address, const std::vector<std::string>& args);

// Starts argv with `env` added, stderr appended to `stderr_path` and, when given, stdout
// written to `stdout_path`; returns its pid.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::filesystem::path& stderr_path,
            const std::filesystem::path& stdout_path = {});
int wait_exit(pid_t pid);
std::string slurp(const std::filesystem::path& p);

// The <interface name="NAME"> ... </interface> block of an introspection XML.
std::string interface_block(const std::string& xml, const std::string& name);

// busctl get-property's value text for a property, e.g. "s \"running\"".
std::string get_property(const std::string& address, const std::string& path,
                         const std::string& interface, const std::string& property);

// Polls `check` every 20 ms until it holds or `timeout` passes.
template <typename Check>
bool eventually(Check check, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (check()) return true;
    ::usleep(20'000);
  }
  return check();
}

}  // namespace thaw::testing
