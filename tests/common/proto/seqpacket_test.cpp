// receive_packet owns every descriptor the kernel hands it: whatever the packet turns out to
// be, the descriptors that came with it are either returned or closed. (thawd's shim socket
// takes packets from any local user; a descriptor kept by mistake is kept forever.)
#include "common/proto/seqpacket.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <vector>

#include "common/fd/unique_fd.hpp"

namespace {

using namespace thaw;
using namespace thaw::proto;

struct Pair {
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a.reset(sv[0]);
    b.reset(sv[1]);
  }
  UniqueFd a, b;
};

// A pipe whose reader sees end-of-file once every copy of the writer is closed — the way to
// tell from outside whether the receiver still holds the copy it was sent.
struct Probe {
  Probe() {
    int p[2];
    EXPECT_EQ(::pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    reader.reset(p[0]);
    writer.reset(p[1]);
  }
  bool every_writer_closed() const {
    pollfd pfd{reader.get(), POLLIN, 0};
    return ::poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLHUP) != 0;
  }
  UniqueFd reader, writer;
};

TEST(SeqPacket, DescriptorsOfAnEmptyMessageAreClosed) {
  Pair s;
  Probe probe;
  ASSERT_TRUE(send_packet(s.a.get(), {}, {probe.writer.get()}));
  probe.writer.reset();
  auto r = receive_packet(s.b.get());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ReceiveErrc::malformed) << r.error().message;
  EXPECT_TRUE(probe.every_writer_closed())
      << "the receiver kept the descriptor of an empty message";
}

TEST(SeqPacket, AnEmptyMessageWithoutDescriptorsReadsAsTheEnd) {
  Pair s;
  ASSERT_TRUE(send_packet(s.a.get(), {}, {}));
  auto r = receive_packet(s.b.get());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ReceiveErrc::closed);
}

TEST(SeqPacket, DescriptorsOfAnOversizedMessageAreClosed) {
  Pair s;
  int size = 4 * 1024 * 1024;
  ASSERT_EQ(::setsockopt(s.a.get(), SOL_SOCKET, SO_SNDBUF, &size, sizeof size), 0);
  Probe probe;
  std::vector<std::byte> big(kMaxMessageBytes + 100, std::byte{'x'});
  ASSERT_TRUE(send_packet(s.a.get(), big, {probe.writer.get()}));
  probe.writer.reset();
  auto r = receive_packet(s.b.get());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ReceiveErrc::malformed);
  EXPECT_TRUE(probe.every_writer_closed());
}

TEST(SeqPacket, DescriptorsOfAGoodMessageAreReturnedAndOwned) {
  Pair s;
  Probe probe;
  const std::array<std::byte, 3> bytes{std::byte{1}, std::byte{2}, std::byte{3}};
  ASSERT_TRUE(send_packet(s.a.get(), bytes, {probe.writer.get(), probe.writer.get()}));
  probe.writer.reset();
  {
    auto r = receive_packet(s.b.get());
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(r->bytes.size(), 3u);
    ASSERT_EQ(r->fds.size(), 2u);
    EXPECT_FALSE(probe.every_writer_closed());
  }
  EXPECT_TRUE(probe.every_writer_closed()) << "the packet's descriptors outlived it";
}

TEST(SeqPacket, ThePeersCloseReadsAsTheEnd) {
  Pair s;
  s.a.reset();
  auto r = receive_packet(s.b.get());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ReceiveErrc::closed);
}

}  // namespace
