// thawd's shim socket against hostile clients (issue 22): random, truncated and oversized
// frames, reply kinds sent as requests, descriptors of every type, messages out of order,
// another engine's slot ids and tokens, storms of connections that never say hello, a
// socket passed to thawd through export_ipc by the client it belongs to; a reload that
// drops a group; artifacts of another user; a state directory holding FIFOs, symlinks and
// documents of the wrong shape. Afterwards a correct client still gets correct answers and
// thawd holds no descriptor or pool page more than before.
#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "common/proto/seqpacket.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace thaw::testing;
using thaw::UniqueFd;
using thaw::proto::Message;
using thaw::proto::MessageType;

// A client that never blocks for long: a hostile test must not hang when thawd does.
class Client {
 public:
  explicit Client(const fs::path& socket) {
    auto fd = thaw::proto::connect_seqpacket(socket.string());
    if (!fd) throw std::runtime_error(fd.error());
    fd_ = std::move(*fd);
  }
  bool send(MessageType type, nlohmann::json body, const std::vector<int>& fds = {}) {
    Message m;
    m.type = type;
    m.request_id = ++next_id_;
    m.body = std::move(body);
    return thaw::proto::send_message(fd_.get(), m, fds).has_value();
  }
  // The next message, or nullopt when none came within `timeout` or thawd closed.
  std::optional<thaw::proto::Received> receive(std::chrono::milliseconds timeout = 5s) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
    auto in = thaw::proto::receive_message(fd_.get());
    if (!in) return std::nullopt;
    return std::move(*in);
  }
  std::optional<thaw::proto::Received> request(MessageType type, nlohmann::json body,
                                               const std::vector<int>& fds = {}) {
    if (!send(type, std::move(body), fds)) return std::nullopt;
    return receive();
  }
  bool hello(const std::string& engine = "hostile-test") {
    auto r = request(MessageType::hello, {{"client", "hostile-test"}, {"engine", engine}});
    return r && r->message.type == MessageType::hello_ok;
  }
  // Whether thawd closed the connection within `timeout`.
  bool closed_by_thawd(std::chrono::milliseconds timeout = 1s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, std::max<int>(0, static_cast<int>(left.count()))) <= 0) return false;
      char b[128];
      const ssize_t n = ::recv(fd_.get(), b, sizeof b, MSG_DONTWAIT | MSG_TRUNC);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN) return true;  // ECONNRESET
    }
  }
  int fd() const { return fd_.get(); }
  UniqueFd take() { return std::move(fd_); }

 private:
  UniqueFd fd_;
  std::uint32_t next_id_ = 0;
};

std::string error_name(const std::optional<thaw::proto::Received>& r) {
  if (!r) return "(no reply)";
  if (r->message.type != MessageType::error) return std::string(to_string(r->message.type));
  return r->message.body.value("name", "");
}

std::size_t open_fds(pid_t pid) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(fmt::format("/proc/{}/fd", pid), ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// What each descriptor of `pid` refers to ("7 -> socket:[123]"), for failure messages.
std::set<std::string> fd_targets(pid_t pid) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(fmt::format("/proc/{}/fd", pid), ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    const fs::path target = fs::read_symlink(it->path(), link_ec);
    out.insert(it->path().filename().string() + " -> " + (link_ec ? "?" : target.string()));
  }
  return out;
}

std::string new_fds(const std::set<std::string>& before, const std::set<std::string>& now) {
  std::string out;
  for (const std::string& f : now) {
    if (!before.contains(f)) out += "\n  new: " + f;
  }
  for (const std::string& f : before) {
    if (!now.contains(f)) out += "\n  gone: " + f;
  }
  return out;
}

// open_fds once two counts 200 ms apart agree (at most 10 s).
std::size_t steady_fd_count(pid_t pid) {
  std::size_t last = open_fds(pid);
  for (int i = 0; i < 50; ++i) {
    ::usleep(200'000);
    const std::size_t now = open_fds(pid);
    if (now == last) return now;
    last = now;
  }
  return last;
}

// Descriptors of every type a hostile client might pass.
struct FdZoo {
  explicit FdZoo(const fs::path& dir) : fifo_path(dir / "zoo.fifo") {
    int sv[2];
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
    add("socket", sv[0]);
    add("socket peer", sv[1]);
    int p[2];
    ::pipe2(p, O_CLOEXEC);
    add("pipe", p[0]);
    add("pipe writer", p[1]);
    ::mkfifo(fifo_path.c_str(), 0600);
    add("fifo", ::open(fifo_path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
    add("directory", ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    add("o_path", ::open(dir.c_str(), O_PATH | O_CLOEXEC));
    add("eventfd", ::eventfd(0, EFD_CLOEXEC));
    add("/dev/null", ::open("/dev/null", O_RDWR | O_CLOEXEC));
    const int memfd = ::memfd_create("zoo", MFD_CLOEXEC);
    (void)::ftruncate(memfd, 4096);
    add("memfd", memfd);
  }
  void add(const std::string& name, int fd) { fds.emplace_back(name, UniqueFd(fd)); }
  int get(const std::string& name) const {
    for (const auto& [n, fd] : fds) {
      if (n == name) return fd.get();
    }
    return -1;
  }
  fs::path fifo_path;
  std::vector<std::pair<std::string, UniqueFd>> fds;
};

// A random JSON value, often of the type a field wants, often not.
nlohmann::json random_value(std::mt19937_64& rng, int depth = 0) {
  switch (rng() % 9) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return static_cast<std::int64_t>(rng());
    case 3:
      return rng();  // unsigned, any size
    case 4:
      return static_cast<double>(rng() % 1000) / 7.0;
    case 5:
      return std::string("g0s") + std::to_string(rng() % 4);
    case 6: {
      // Control characters and escapes, kept valid UTF-8 (JSON cannot carry other bytes).
      std::string s(rng() % 40, ' ');
      for (char& c : s) c = static_cast<char>(rng() % 128);
      return s + (rng() % 4 == 0 ? "\u00e9\u2028" : "");
    }
    case 7: {
      nlohmann::json a = nlohmann::json::array();
      if (depth < 3) {
        for (std::uint64_t i = rng() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1));
      }
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      if (depth < 3) {
        for (std::uint64_t i = rng() % 4; i > 0; --i) {
          o[std::to_string(rng() % 8)] = random_value(rng, depth + 1);
        }
      }
      return o;
    }
  }
}

// A request-like body: the protocol's field names with random values.
nlohmann::json random_body(std::mt19937_64& rng) {
  static const char* const kFields[] = {"model",    "path",     "slot",     "token",  "offsets",
                                        "bytes",    "kind",     "identity", "engine", "counters",
                                        "gpu_uuid", "handback", "client",   "pid"};
  nlohmann::json body = nlohmann::json::object();
  for (std::uint64_t i = rng() % 5; i > 0; --i) {
    body[kFields[rng() % std::size(kFields)]] = random_value(rng);
  }
  return body;
}

// One packet of random garbage of some kind.
std::vector<std::byte> random_packet(std::mt19937_64& rng) {
  Message m;
  m.type = static_cast<MessageType>(rng() % 24);  // unknown types and reply types too
  m.request_id = static_cast<std::uint32_t>(rng());
  m.version = rng() % 8 == 0 ? static_cast<std::uint16_t>(rng()) : thaw::proto::kProtocolVersion;
  m.body = random_body(rng);
  Message safe = m;
  safe.type = MessageType::hello;
  auto encoded = thaw::proto::encode(m);
  std::vector<std::byte> packet = encoded ? *encoded : *thaw::proto::encode(safe);
  switch (rng() % 6) {
    case 0:  // truncated
      packet.resize(rng() % (packet.size() + 1));
      break;
    case 1: {  // a header that lies about the length
      const std::uint32_t length = static_cast<std::uint32_t>(rng());
      std::memcpy(packet.data() + 12, &length, 4);
      break;
    }
    case 2:  // bytes, random
      packet.resize(rng() % 200);
      for (std::byte& b : packet) b = static_cast<std::byte>(rng());
      break;
    case 3:  // oversized
      packet.resize(thaw::proto::kMaxMessageBytes + 1 + rng() % 4096, std::byte{' '});
      break;
    default:  // well formed
      break;
  }
  return packet;
}

bool send_packet(int fd, const std::vector<std::byte>& packet, const std::vector<int>& fds) {
  std::byte none{};
  iovec iov{packet.empty() ? &none : const_cast<std::byte*>(packet.data()), packet.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<std::size_t>(fds.size(), 1)));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0;
}

class HostileClientTest : public ThawdFixture {
 protected:
  std::uint64_t pool_free_bytes() {
    auto r = thawctl({"--json", "gpus"});
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    if (!j.is_array() || j.empty()) return 0;
    return j[0].value("free_bytes", std::uint64_t{0});
  }
  nlohmann::json slots() {
    auto j = nlohmann::json::parse(thawctl({"--json", "slots"}).output, nullptr, false);
    return j.is_array() ? j : nlohmann::json::array();
  }
  bool prewarmed_and_free() {
    auto s = slots();
    return s.size() == 1 && s[0].value("state", "") == "prewarmed" && s[0].value("owner", "") == "";
  }
  bool thawd_alive() { return ::kill(thawd_pid(), 0) == 0; }
  // A correct client still gets correct answers.
  void expect_correct_answers() {
    Client c(socket_path());
    ASSERT_TRUE(c.hello()) << log();
    auto file = c.request(MessageType::open_file, {{"model", "gpt-syn"}, {"path", "config.json"}});
    ASSERT_TRUE(file);
    EXPECT_EQ(file->message.type, MessageType::file) << file->message.body.dump();
    EXPECT_EQ(file->fds.size(), 2u);
  }
};

TEST_F(HostileClientTest, HostileShimClientsLeaveThawdServingAndHoldingNothing) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_TRUE(eventually([&] { return prewarmed_and_free(); }, 60s)) << slots().dump();
  expect_correct_answers();
  ASSERT_TRUE(eventually([&] { return thawctl({"--json", "gpus"}).exit_code == 0; }));
  const std::uint64_t free_before = pool_free_bytes();
  // Every client above has gone; what thawd holds now is its own, once the count is steady
  // (a closed client's descriptor goes when thawd's loop gets to it, which on a loaded
  // machine takes longer than any fixed pause).
  const std::size_t fds_before = steady_fd_count(thawd_pid());
  const std::set<std::string> fd_targets_before = fd_targets(thawd_pid());
  ASSERT_GT(fds_before, 0u);
  FdZoo zoo(dir_.path());

  // 1. Descriptors of every type offered as a VMM handle: only what a driver export can be
  //    (a memfd from the emulator, a character device from NVIDIA's driver) is taken.
  {
    Client c(socket_path());
    ASSERT_TRUE(c.hello());
    for (const auto& [name, fd] : zoo.fds) {
      auto r = c.request(MessageType::export_ipc, {{"bytes", 4096}}, {fd.get()});
      ASSERT_TRUE(r) << name << ": no answer, thawd closed the connection";
      if (name == "memfd" || name == "/dev/null") continue;
      EXPECT_EQ(error_name(r), "org.thaw.Error.InvalidArgument")
          << "a " << name << " was accepted as a VMM handle";
    }
    // Artifacts are documents: anything but a memfd is refused, and a FIFO never blocks.
    const nlohmann::json id = {{"engine", "e"}, {"model", "m"}, {"gpu", "g"}, {"driver", "1"}};
    for (const auto& [name, fd] : zoo.fds) {
      if (name == "memfd") continue;
      auto r = c.request(MessageType::report_artifact,
                         {{"kind", "layout"}, {"identity", id}, {"bytes", 10}}, {fd.get()});
      ASSERT_TRUE(r) << name << ": no answer within 5 s (thawd blocked?)";
      EXPECT_EQ(error_name(r), "org.thaw.Error.InvalidArgument") << name;
    }
    // Descriptors on a message that carries none, or too many: the connection goes.
    Client extra(socket_path());
    ASSERT_TRUE(extra.hello());
    ASSERT_TRUE(extra.send(MessageType::open_file, {{"model", "gpt-syn"}, {"path", "config.json"}},
                           {zoo.get("pipe"), zoo.get("eventfd")}));
    EXPECT_TRUE(extra.closed_by_thawd());
    // An empty packet with descriptors reads like a close (0 bytes): its descriptors were
    // once kept forever that way.
    Client empty(socket_path());
    ASSERT_TRUE(empty.hello());
    ASSERT_TRUE(send_packet(empty.fd(), {}, {zoo.get("/dev/null"), zoo.get("directory")}));
    EXPECT_TRUE(empty.closed_by_thawd());
  }

  // 2. Random frames, truncated and oversized ones, reply kinds and unknown kinds, requests
  //    before hello and a second hello, with random descriptors attached.
  {
    const std::uint64_t seed = std::random_device{}();
    SCOPED_TRACE(fmt::format("seed {}", seed));
    std::mt19937_64 rng(seed);
    for (int conn = 0; conn < 150; ++conn) {
      Client c(socket_path());
      if (rng() % 2 == 0) (void)c.hello();
      for (std::uint64_t i = 1 + rng() % 8; i > 0; --i) {
        std::vector<int> fds;
        if (rng() % 4 == 0) {
          for (std::uint64_t k = 1 + rng() % 3; k > 0; --k) {
            fds.push_back(zoo.fds[rng() % zoo.fds.size()].second.get());
          }
        }
        if (!send_packet(c.fd(), random_packet(rng), fds)) break;
        if (rng() % 2 == 0) (void)c.receive(20ms);
      }
    }
    ASSERT_TRUE(thawd_alive()) << log();
  }

  // 3. Another engine's slot: its token confirms only for the connection it was given to.
  {
    Client victim(socket_path()), other(socket_path());
    ASSERT_TRUE(victim.hello());
    ASSERT_TRUE(other.hello());
    auto slot = victim.request(MessageType::attach_slot, {{"model", "gpt-syn"}});
    ASSERT_TRUE(slot);
    ASSERT_EQ(slot->message.type, MessageType::slot) << slot->message.body.dump();
    const std::string id = slot->message.body["slot"];
    const std::uint64_t token = slot->message.body["token"];
    for (int i = 0; i < slot->message.body["page_messages"].get<int>(); ++i) {
      ASSERT_TRUE(victim.receive());
    }
    EXPECT_GT(token, std::uint64_t{1} << 32) << "tokens must not be guessable";
    for (std::uint64_t guess = 0; guess < 16; ++guess) {
      EXPECT_EQ(error_name(other.request(MessageType::imported, {{"slot", id}, {"token", guess}})),
                "org.thaw.Error.InvalidArgument");
    }
    EXPECT_NE(error_name(other.request(MessageType::imported, {{"slot", id}, {"token", token}})),
              "ok")
        << "another engine confirmed this engine's export";
    EXPECT_NE(error_name(other.request(MessageType::free_pages, {{"slot", id}, {"offsets", {0}}})),
              "ok");
    EXPECT_NE(error_name(other.request(MessageType::release, {{"slot", id}, {"handback", true}})),
              "ok");
    EXPECT_EQ(error_name(victim.request(MessageType::imported, {{"slot", id}, {"token", token}})),
              "ok")
        << "the owner's own confirmation was refused";
    EXPECT_EQ(error_name(victim.request(MessageType::release, {{"slot", id}, {"handback", true}})),
              "ok");
    ASSERT_TRUE(eventually([&] { return prewarmed_and_free(); }, 60s)) << slots().dump();
  }

  // 4. Counters: a report that would wrap thawd's totals is refused, and many of the
  //    largest allowed ones saturate the total instead of wrapping it.
  {
    Client c(socket_path());
    ASSERT_TRUE(c.hello());
    auto r = c.request(MessageType::report_counters,
                       {{"counters", {{"calls_intercepted", std::uint64_t{1} << 63}}}});
    EXPECT_NE(error_name(r), "ok") << "a counter of 2^63 was taken";
    Client many(socket_path());
    ASSERT_TRUE(many.hello());
    nlohmann::json counters = {{"calls_intercepted", std::uint64_t{1} << 53},
                               {"deterministic_allocations", 0},
                               {"layout_divergences", 0},
                               {"files_streamed", 0},
                               {"reads_waited", 0},
                               {"bytes_streamed", 0},
                               {"graph_records_stored", 0},
                               {"graphs_restored", 0},
                               {"graph_restore_fallbacks", 0},
                               {"kv_restores", 0},
                               {"kv_restore_fallbacks", 0}};
    for (int i = 0; i < 2100; ++i) {
      ASSERT_EQ(error_name(many.request(MessageType::report_counters, {{"counters", counters}})),
                "ok")
          << i;
    }
    const std::string metrics = run({"/usr/bin/curl", "-sf", metrics_url()}).output;
    EXPECT_NE(metrics.find("thaw_engine_calls_intercepted_total 18446744073709551615\n"),
              std::string::npos)
        << "the total wrapped: " << metrics.substr(metrics.find("thaw_engine_calls"), 200);
  }

  // 5. Log forging: an engine name with a line break does not start a line of its own
  //    (whether thawd refuses the hello or logs the name escaped).
  {
    Client c(socket_path());
    (void)c.hello("evil\nFORGED: thawd is compromised\x1b[2J");
  }

  // 6. Storms: connections that never say hello are bounded and time out; a correct client
  //    still gets in while they last.
  {
    std::vector<Client> storm;
    for (int i = 0; i < 200; ++i) storm.emplace_back(socket_path());
    expect_correct_answers();
    // Before the hello deadline (5 s) only the bound can have closed them; thawd may still
    // be accepting the storm on a loaded machine, so the count is given until 4 s.
    std::size_t closed = 0;
    EXPECT_TRUE(eventually(
        [&] {
          closed = 0;
          for (Client& c : storm) closed += c.closed_by_thawd(0ms);
          return closed > 100;
        },
        4s))
        << closed << " of 200 un-greeted connections closed: they are not bounded";
    EXPECT_TRUE(eventually(
        [&] {
          std::size_t n = 0;
          for (Client& c : storm) n += c.closed_by_thawd(0ms) || !c.fd();
          return n == storm.size();
        },
        20s))
        << "connections that never said hello were kept";
  }

  // 7. The connection's own socket, passed through export_ipc by a client that holds a
  //    slot and then exits: thawd must still see it go and give the slot back.
  {
    Client c(socket_path());
    ASSERT_TRUE(c.hello());
    auto slot = c.request(MessageType::attach_slot, {{"model", "gpt-syn"}});
    ASSERT_TRUE(slot);
    ASSERT_EQ(slot->message.type, MessageType::slot);
    for (int i = 0; i < slot->message.body["page_messages"].get<int>(); ++i) {
      ASSERT_TRUE(c.receive());
    }
    (void)c.request(MessageType::export_ipc, {{"bytes", 4096}}, {c.fd()});
    UniqueFd gone = c.take();  // the client exits
  }
  // It never handed the slot back: thawd evicts it, as for any engine that dies.
  EXPECT_TRUE(eventually([&] { return slots().empty(); }, 20s))
      << "the slot of a client that exited is still held: " << slots().dump();
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_TRUE(eventually([&] { return prewarmed_and_free(); }, 60s)) << slots().dump();

  // Afterwards: still serving, and holding what it held before.
  ASSERT_TRUE(thawd_alive()) << log();
  expect_correct_answers();
  EXPECT_TRUE(eventually([&] { return open_fds(thawd_pid()) == fds_before; }, 20s))
      << open_fds(thawd_pid()) << " descriptors open, " << fds_before
      << " before:" << new_fds(fd_targets_before, fd_targets(thawd_pid()));
  EXPECT_TRUE(eventually([&] { return pool_free_bytes() == free_before; }, 20s))
      << pool_free_bytes() << " pool bytes free, " << free_before << " before";
  EXPECT_EQ(stop_thawd(), 0) << log();
  const std::string text = log();
  EXPECT_EQ(text.find("\nFORGED"), std::string::npos) << "a client wrote a log line of its own";
  EXPECT_EQ(text.find("\x1b"), std::string::npos)
      << "a client's control characters reached the log";
}

// Runs `body` in a child as nobody:nogroup; returns its exit status.
template <typename Body>
int as_nobody(Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(90);
    try {
      ::_exit(body());
    } catch (...) {
      ::_exit(91);
    }
  }
  return wait_exit(child);
}

TEST_F(HostileClientTest, AReloadThatDropsAGroupDisconnectsItsEngines) {
  allow_groups_ = R"(["thaw", "nogroup"])";
  start_thawd(BusPolicy::open);
  int go[2], done[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(90);
    Client c(socket_path());
    char r = c.hello() ? 'y' : 'n';
    (void)!::write(done[1], &r, 1);
    (void)!::read(go[0], &r, 1);  // the reload happened
    ::_exit(c.closed_by_thawd(5s) ? 0 : 1);
  }
  char r = 0;
  ASSERT_EQ(::read(done[0], &r, 1), 1);
  ASSERT_EQ(r, 'y') << "nogroup is allowed before the reload:\n" << log();
  allow_groups_ = R"(["thaw"])";
  write_config();
  ::kill(thawd_pid(), SIGHUP);
  ASSERT_TRUE(eventually([&] { return log().find("reloaded") != std::string::npos; }, 10s));
  (void)!::write(go[1], "x", 1);
  EXPECT_EQ(wait_exit(child), 0) << "a peer no longer allowed stayed connected";
  for (int fd : {go[0], go[1], done[0], done[1]}) ::close(fd);
  EXPECT_NE(log().find("not allowed by the reloaded shim.allow_groups"), std::string::npos)
      << log();
  Client root(socket_path());
  EXPECT_TRUE(root.hello()) << "root is still served";
  EXPECT_EQ(stop_thawd(), 0) << log();
}

// Sends an artifact document for `identity` as `kind`; returns the reply's type or error.
std::string put_artifact(Client& c, const nlohmann::json& identity) {
  const std::string doc = nlohmann::json{{"identity", identity}, {"allocations", {1, 2}}}.dump();
  UniqueFd fd(::memfd_create("artifact", MFD_CLOEXEC));
  (void)!::write(fd.get(), doc.data(), doc.size());
  return error_name(c.request(MessageType::report_artifact,
                              {{"kind", "layout"}, {"identity", identity}, {"bytes", doc.size()}},
                              {fd.get()}));
}

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) out.push_back(it->path());
  }
  return out;
}

TEST_F(HostileClientTest, ArtifactsBelongToTheUserWhoseEngineRecordedThem) {
  allow_groups_ = R"(["thaw", "nogroup"])";
  start_thawd(BusPolicy::open);
  const nlohmann::json id = {{"engine", "e"}, {"model", "m"}, {"gpu", "g"}, {"driver", "1"}};
  // nobody records one; root does not get it, and nobody's own engines do.
  EXPECT_EQ(as_nobody([&] {
              Client c(socket_path());
              if (!c.hello()) return 1;
              return put_artifact(c, id) == "ok" ? 0 : 2;
            }),
            0)
      << log();
  Client root(socket_path());
  ASSERT_TRUE(root.hello());
  EXPECT_EQ(
      error_name(root.request(MessageType::get_artifact, {{"kind", "layout"}, {"identity", id}})),
      "org.thaw.Error.UnknownArtifact")
      << "root's engines read a record another user wrote";
  EXPECT_EQ(as_nobody([&] {
              Client c(socket_path());
              if (!c.hello()) return 1;
              auto r = c.request(MessageType::get_artifact, {{"kind", "layout"}, {"identity", id}});
              return r && r->message.type == MessageType::artifact && r->fds.size() == 1 ? 0 : 2;
            }),
            0);
  // Root records its own (kept apart: nobody's is unchanged).
  EXPECT_EQ(put_artifact(root, id), "ok");
  const auto files = files_under(dir_.path() / "state" / "artifacts");
  ASSERT_EQ(files.size(), 2u);
  for (const fs::path& f : files) {
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0027, 0u) << f << " is readable by others: " << std::oct << st.st_mode;
  }
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(HostileClientTest, AHostileStateDirectoryNeitherStopsNorBlocksThawd) {
  start_registry();
  start_thawd(BusPolicy::open);
  const nlohmann::json id = {{"engine", "e"}, {"model", "m"}, {"gpu", "g"}, {"driver", "1"}};
  {
    Client c(socket_path());
    ASSERT_TRUE(c.hello());
    ASSERT_EQ(put_artifact(c, id), "ok");
  }
  // The record becomes a FIFO: reading it must neither block thawd's loop nor be served.
  auto files = files_under(dir_.path() / "state" / "artifacts");
  ASSERT_EQ(files.size(), 1u);
  const fs::path record = files[0], dir = record.parent_path();
  fs::remove(record);
  ASSERT_EQ(::mkfifo(record.c_str(), 0600), 0);
  {
    Client c(socket_path());
    ASSERT_TRUE(c.hello());
    auto r = c.request(MessageType::get_artifact, {{"kind", "layout"}, {"identity", id}});
    ASSERT_TRUE(r) << "get_artifact of a FIFO got no answer: thawd's loop is blocked";
    EXPECT_EQ(r->message.type, MessageType::error);
  }
  // Layout records prewarm reads: a FIFO, a symlink, a directory, and identities whose
  // fields are of the wrong type, all newer than anything else.
  const std::string model_key = "gpt-syn";
  auto future = [](const fs::path& p, int days) {
    timespec t[2];
    ::clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec += days * 86400;
    t[1] = t[0];
    ::utimensat(AT_FDCWD, p.c_str(), t, AT_SYMLINK_NOFOLLOW);
  };
  int n = 0;
  auto name = [&] { return fmt::format("layout-{:032x}.json", ++n); };
  for (const fs::path& d : {dir, dir.parent_path()}) {
    fs::path p = d / name();
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
    future(p, 3);
    p = d / name();
    fs::create_symlink("/proc/self/environ", p);
    future(p, 3);
    p = d / name();
    fs::create_directory(p);
    future(p, 3);
    for (const nlohmann::json& bad :
         {nlohmann::json{{"identity", {{"model", 5}, {"engine", {1}}}}},
          nlohmann::json{{"identity", {{"model", model_key}}}, {"allocations", "x"}, {"copies", 7}},
          nlohmann::json{{"identity", "gpt-syn"}}, nlohmann::json::array({1, 2}),
          nlohmann::json{
              {"identity", {{"engine", "e"}, {"model", model_key}, {"gpu", "g"}, {"driver", "1"}}},
              {"format", "1"},
              {"truncated", 3}}}) {
      p = d / name();
      std::ofstream(p) << bad.dump();
      future(p, 2);
    }
  }
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  EXPECT_TRUE(eventually([&] { return prewarmed_and_free(); }, 60s)) << slots().dump() << "\n"
                                                                     << log();
  ASSERT_TRUE(thawd_alive()) << log();
  // Again after a restart: nothing it reads at start or on demand takes it down.
  EXPECT_EQ(stop_thawd(), 0) << log();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  EXPECT_TRUE(eventually([&] { return !slots().empty(); }, 60s)) << log();
  ASSERT_TRUE(thawd_alive()) << log();
  expect_correct_answers();
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
