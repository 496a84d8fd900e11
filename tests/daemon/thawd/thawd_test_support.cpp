#include "thawd_test_support.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace thaw::testing {

namespace fs = std::filesystem;

namespace {

// In a forked child: SIGTERM when the test process goes, however it goes. A test that aborts
// (an ASan report, a crash) would otherwise leave thawd or dbus-daemon running with ctest's
// output pipe open, and ctest would wait for its timeout instead of reporting the failure.
void die_with_the_test(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(127);  // the test went before the prctl
}

}  // namespace

NotifySocket::NotifySocket(const fs::path& path) {
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw std::runtime_error("bind notify socket");
  }
}

NotifySocket::~NotifySocket() {
  ::close(fd_);
}

std::string NotifySocket::next(std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
  char buf[4096];
  const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
}

std::vector<std::string> NotifySocket::until(const std::string& what) {
  std::vector<std::string> seen;
  for (;;) {
    std::string m = next();
    if (m.empty()) return {};
    seen.push_back(m);
    if (m.find(what) != std::string::npos) return seen;
  }
}

PrivateBus::PrivateBus(const fs::path& dir, BusPolicy policy)
    : address_("unix:path=" + (dir / "bus").string()) {
  const fs::path conf = dir / "bus.conf";
  std::ofstream out(conf);
  out << "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\" "
         "\"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
         "<busconfig><type>custom</type><listen>"
      << address_ << "</listen><auth>EXTERNAL</auth>\n";
  if (policy == BusPolicy::open) {
    out << "<policy context=\"default\"><allow user=\"*\"/><allow own=\"*\"/>"
           "<allow send_destination=\"*\"/><allow receive_sender=\"*\"/></policy>\n";
  } else {
    // The system bus's default context (Debian's /usr/share/dbus-1/system.conf), then the
    // shipped policy file exactly as installed.
    out << "<policy context=\"default\"><allow user=\"*\"/><deny own=\"*\"/>"
           "<deny send_type=\"method_call\"/><allow send_type=\"signal\"/>"
           "<allow send_requested_reply=\"true\" send_type=\"method_return\"/>"
           "<allow send_requested_reply=\"true\" send_type=\"error\"/>"
           "<allow receive_type=\"method_call\"/><allow receive_type=\"method_return\"/>"
           "<allow receive_type=\"error\"/><allow receive_type=\"signal\"/>"
           "<allow send_destination=\"org.freedesktop.DBus\" "
           "send_interface=\"org.freedesktop.DBus\"/>"
           "<allow send_destination=\"org.freedesktop.DBus\" "
           "send_interface=\"org.freedesktop.DBus.Introspectable\"/>"
           "</policy>\n"
           "<policy user=\"root\"><allow send_destination=\"org.freedesktop.DBus\" "
           "send_interface=\"org.freedesktop.DBus.Monitoring\"/></policy>\n"
        << "<include>" << THAW_SOURCE_DIR << "/packaging/org.thaw.Node1.conf</include>\n";
  }
  out << "</busconfig>\n";
  out.close();
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    die_with_the_test(parent);
    ::execl("/usr/bin/dbus-daemon", "dbus-daemon", "--nofork", "--nopidfile",
            ("--config-file=" + conf.string()).c_str(), nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 500 && !fs::exists(dir / "bus"); ++i) ::usleep(10'000);
}

PrivateBus::~PrivateBus() {
  ::kill(pid_, SIGTERM);
  ::waitpid(pid_, nullptr, 0);
}

ProgramResult run(const std::vector<std::string>& argv) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  ProgramResult r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0)
    r.output.append(buf, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  r.exit_code = wait_exit(pid);
  return r;
}

ProgramResult busctl(const std::string& address, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/busctl", "--address=" + address};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

ProgramResult busctl_as_nobody(const std::string& address, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=65534",   "--regid=65534",
                                   "--clear-groups",   "/usr/bin/busctl", "--address=" + address};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

ProgramResult dbus_send(const std::string& address, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/dbus-send", "--bus=" + address, "--print-reply",
                                   "--dest=org.thaw.Node1"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const fs::path& stderr_path, const fs::path& stdout_path) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    die_with_the_test(parent);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(err, 2);
    if (!stdout_path.empty()) {
      ::dup2(::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string interface_block(const std::string& xml, const std::string& name) {
  const auto begin = xml.find("<interface name=\"" + name + "\">");
  if (begin == std::string::npos) return "";
  const auto end = xml.find("</interface>", begin);
  return end == std::string::npos ? "" : xml.substr(begin, end - begin);
}

std::string get_property(const std::string& address, const std::string& path,
                         const std::string& interface, const std::string& property) {
  ProgramResult r = busctl(address, {"get-property", "org.thaw.Node1", path, interface, property});
  if (!r.output.empty() && r.output.back() == '\n') r.output.pop_back();
  return r.output;
}

}  // namespace thaw::testing
