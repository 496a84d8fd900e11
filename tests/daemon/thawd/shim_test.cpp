// thawd's shim socket end to end: a client (common/proto, as the preload shim will use it)
// gets a cache file still being fetched and reads correct bytes as they arrive; bad
// clients lose only their own connection; refused peers are told why; a client killed
// while holding a slot gives it back; SIGTERM leaves no GPU memory behind in the emulator's
// device ledger (and kill -9, the control, does).
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/proto/seqpacket.hpp"
#include "common/readiness/chunk_readiness.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace thaw::testing;
using thaw::UniqueFd;
using thaw::proto::Message;
using thaw::proto::MessageType;

// A connected, greeted client.
class ShimClient {
 public:
  explicit ShimClient(const fs::path& socket) {
    auto fd = thaw::proto::connect_seqpacket(socket.string());
    if (!fd) throw std::runtime_error(fd.error());
    fd_ = std::move(*fd);
  }
  thaw::proto::Received request(MessageType type, nlohmann::json body) {
    Message m;
    m.type = type;
    m.request_id = ++next_id_;
    m.body = std::move(body);
    auto sent = thaw::proto::send_message(fd_.get(), m);
    if (!sent) throw std::runtime_error(sent.error());
    return receive();
  }
  thaw::proto::Received receive() {
    auto in = thaw::proto::receive_message(fd_.get());
    if (!in) throw std::runtime_error("receive: " + in.error().message);
    return std::move(*in);
  }
  Message hello() {
    return request(MessageType::hello, {{"client", "shim-test"}, {"engine", "test"}}).message;
  }
  // Whether thawd closed the connection (recv returns 0 within a second).
  bool closed_by_thawd() {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) return false;
    char b;
    return ::recv(fd_.get(), &b, 1, MSG_DONTWAIT) == 0;
  }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  std::uint32_t next_id_ = 0;
};

std::string last_shard(const fs::path& model_dir) {
  std::string last;
  for (const std::string& f : thaw::store::testing::model_files(model_dir)) {
    if (f.ends_with(".safetensors")) last = f;
  }
  return last;
}

// Entries (and bytes) the emulator's device ledger holds for `pid`.
std::pair<int, std::uint64_t> ledger_of(const fs::path& state_dir, pid_t pid) {
  std::ifstream in(state_dir / "device0.ledger", std::ios::binary);
  char magic[8];
  std::uint32_t count = 0, reserved = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&count), 4);
  in.read(reinterpret_cast<char*>(&reserved), 4);
  int entries = 0;
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < count && in; ++i) {
    struct {
      std::int32_t pid;
      std::uint32_t reserved;
      std::uint64_t start_time, inode, id, bytes;
    } e{};
    in.read(reinterpret_cast<char*>(&e), sizeof(e));
    if (e.pid == pid) {
      ++entries;
      bytes += e.bytes;
    }
  }
  return {entries, bytes};
}

TEST_F(ThawdFixture, ShimClientReadsAFileWhileItIsBeingFetched) {
  start_registry();
  start_thawd(BusPolicy::open, "4MB");
  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0);
  ShimClient client(socket_path());
  const Message hello = client.hello();
  ASSERT_EQ(hello.type, MessageType::hello_ok) << hello.body.dump();
  EXPECT_EQ(hello.body["protocol"], thaw::proto::kProtocolVersion);

  const std::string shard = last_shard(registry_->model_dir());
  std::optional<thaw::proto::Received> file;
  ASSERT_TRUE(eventually([&] {
    auto r = client.request(MessageType::open_file, {{"model", "gpt-syn"}, {"path", shard}});
    if (r.message.type == MessageType::error) {
      EXPECT_EQ(r.message.body["name"], "org.thaw.Error.NotReady") << r.message.body.dump();
      return false;
    }
    file = std::move(r);
    return true;
  }));
  ASSERT_EQ(file->message.type, MessageType::file) << file->message.body.dump();
  ASSERT_EQ(file->fds.size(), 2u);
  EXPECT_FALSE(file->message.body["complete"].get<bool>()) << "the last shard came too early";
  const std::uint64_t size = file->message.body["size"];
  EXPECT_EQ(size, fs::file_size(registry_->model_dir() / shard));

  auto readiness = thaw::store::ChunkReadiness::open_reader(std::move(file->fds[1]), shard);
  ASSERT_TRUE(readiness) << readiness.error().message;
  const auto expected = thaw::store::testing::read_file(registry_->model_dir() / shard);
  std::uint64_t waited_for = 0;
  for (std::uint64_t c = 0; c < readiness->chunk_count(); ++c) {
    const std::uint64_t offset = readiness->chunk_offset(c), length = readiness->chunk_length(c);
    if (!readiness->is_ready(offset, length)) ++waited_for;
    auto w = readiness->wait_ready(offset, length, 60s);
    ASSERT_EQ(w.status, thaw::store::WaitStatus::ready) << "chunk " << c << " " << w.failure_reason;
    std::vector<std::byte> bytes(length);
    ASSERT_EQ(::pread(file->fds[0].get(), bytes.data(), length, static_cast<off_t>(offset)),
              static_cast<ssize_t>(length));
    ASSERT_TRUE(
        std::equal(bytes.begin(), bytes.end(), expected.begin() + static_cast<long>(offset)))
        << "chunk " << c << " differs from the registry's bytes";
  }
  EXPECT_GT(waited_for, 0u) << "every chunk was in before the client asked: nothing streamed";
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, BadShimMessagesCloseOnlyTheirOwnConnection) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0);
  ShimClient good(socket_path());
  ASSERT_EQ(good.hello().type, MessageType::hello_ok);

  ShimClient garbage(socket_path());
  ASSERT_EQ(::send(garbage.fd(), "GET / HTTP/1.0\r\n\r\n", 18, 0), 18);
  EXPECT_TRUE(garbage.closed_by_thawd());

  ShimClient oversized(socket_path());
  std::vector<char> big(thaw::proto::kMaxMessageBytes + 4096, 'x');
  ::send(oversized.fd(), big.data(), big.size(), 0);
  EXPECT_TRUE(oversized.closed_by_thawd());

  ShimClient no_hello(socket_path());
  Message m;
  m.type = MessageType::open_file;
  m.body = {{"model", "gpt-syn"}, {"path", "config.json"}};
  ASSERT_TRUE(thaw::proto::send_message(no_hello.fd(), m));
  EXPECT_TRUE(no_hello.closed_by_thawd());

  ShimClient wrong_type(socket_path());
  ASSERT_EQ(wrong_type.hello().type, MessageType::hello_ok);
  m.type = MessageType::open_file;
  m.body = {{"model", 42}};
  ASSERT_TRUE(thaw::proto::send_message(wrong_type.fd(), m));
  EXPECT_TRUE(wrong_type.closed_by_thawd());

  ShimClient future(socket_path());
  m.version = 9;
  m.type = MessageType::hello;
  m.body = nlohmann::json::object();
  ASSERT_TRUE(thaw::proto::send_message(future.fd(), m));
  auto answer = future.receive();
  EXPECT_EQ(answer.message.type, MessageType::error);
  EXPECT_NE(answer.message.body["message"].get<std::string>().find(
                "thawd speaks version " + std::to_string(thaw::proto::kProtocolVersion)),
            std::string::npos);
  EXPECT_TRUE(future.closed_by_thawd());

  // The good client is still served, and a request error keeps its connection.
  auto file = good.request(MessageType::open_file, {{"model", "gpt-syn"}, {"path", "config.json"}});
  EXPECT_EQ(file.message.type, MessageType::file) << file.message.body.dump();
  EXPECT_TRUE(file.message.body["complete"].get<bool>());
  auto missing = good.request(MessageType::open_file, {{"model", "gpt-syn"}, {"path", "nope.bin"}});
  EXPECT_EQ(missing.message.type, MessageType::error);
  EXPECT_EQ(missing.message.body["name"], "org.thaw.Error.UnknownModel");
  EXPECT_EQ(good.request(MessageType::open_file, {{"model", "gpt-syn"}, {"path", "config.json"}})
                .message.type,
            MessageType::file);
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, ShimPeerOutsideTheAllowRuleIsToldWhyAndDisconnected) {
  start_thawd(BusPolicy::open);
  const pid_t child = ::fork();
  if (child == 0) {
    // As nobody, no supplementary groups.
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    try {
      ShimClient c(socket_path());
      const Message reply = c.hello();
      if (reply.type != MessageType::error) ::_exit(11);
      if (reply.body["name"] != "org.freedesktop.DBus.Error.AccessDenied") ::_exit(12);
      if (reply.body["message"].get<std::string>().find("uid 65534") == std::string::npos)
        ::_exit(13);
      ::_exit(c.closed_by_thawd() ? 0 : 14);
    } catch (...) {
      ::_exit(15);
    }
  }
  EXPECT_EQ(wait_exit(child), 0);
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, SlotHeldByAKilledShimClientIsEvicted) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    ShimClient c(socket_path());
    c.hello();
    auto slot = c.request(MessageType::attach_slot, {{"model", "gpt-syn"}});
    if (slot.message.type != MessageType::slot) ::_exit(1);
    std::size_t fds = 0, pages = 0;
    for (int i = 0; i < slot.message.body["page_messages"].get<int>(); ++i) {
      auto p = c.receive();
      fds += p.fds.size();
      pages += p.message.body["pages"].size();
    }
    const char ok = (fds == pages && fds > 0) ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ::close(ready[0]);
  EXPECT_EQ(ok, 'y') << "one descriptor per page";
  const std::string slot = "/org/thaw/Node1/slot/g0s0";
  // Properties lag by at most one refresh tick.
  EXPECT_TRUE(eventually([&] {
    return get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "Owner")
               .find("pid " + std::to_string(child)) != std::string::npos;
  }));
  auto busy = thawctl({"evict", "g0s0"});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_NE(busy.output.find("held by an engine"), std::string::npos) << busy.output;

  ::kill(child, SIGKILL);
  wait_exit(child);
  // A client that dies without handing the slot back cannot vouch for its pages: thawd
  // evicts the slot.
  EXPECT_TRUE(eventually([&] {
    return thawctl({"--json", "slots"}).output == "[]\n";
  })) << thawctl({"slots"}).output;
  auto metrics = run({"/usr/bin/curl", "-sf", metrics_url()});
  EXPECT_NE(metrics.output.find("thaw_prewarm_hits_total 1\n"), std::string::npos)
      << metrics.output;
  EXPECT_EQ(stop_thawd(), 0) << log();
  EXPECT_NE(log().find("gave back 1 slot(s)"), std::string::npos) << log();
}

TEST_F(ThawdFixture, SigtermLeavesNoGpuMemoryAllocatedButKillNineDoes) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_EQ(thawctl({"activate", "g0s0"}).exit_code, 0) << log();
  pid_t pid = thawd_pid();
  EXPECT_GT(ledger_of(emu_state_dir(), pid).second, 0u) << "the slot's pages are in the ledger";
  EXPECT_EQ(stop_thawd(), 0) << log();
  EXPECT_EQ(ledger_of(emu_state_dir(), pid), std::make_pair(0, std::uint64_t{0}));

  // The control: a thawd killed outright leaves its entries (the emulator prunes them only
  // when someone next looks), so the check above can fail.
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  pid = thawd_pid();
  kill_thawd();
  EXPECT_GT(ledger_of(emu_state_dir(), pid).first, 0);
}

}  // namespace
