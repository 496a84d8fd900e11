// Knobs of the RangeFetcher. Defaults suit a registry on a LAN or loopback.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/store/registry/fetch_types.hpp"

namespace thaw::network {
class FetchWindows;  // daemon/network/fetch_window.hpp
}

namespace thaw::store {

// A per-class rate limit shared by all of the class's transfers (a token bucket).
struct RateLimit {
  std::uint64_t bytes_per_s = 0;  // 0: unlimited
  std::uint64_t burst_bytes = 0;  // bucket depth; 0: bytes_per_s / 10, at least 256 KiB
};

// Values written on every socket carrying a class's traffic, so an eBPF program (or tc)
// can classify it in the kernel. nullopt leaves the option alone. SO_MARK needs
// CAP_NET_ADMIN; SO_PRIORITY above 6 does too.
struct SocketTags {
  std::optional<std::uint32_t> so_mark;
  std::optional<int> so_priority;
  // Bytes/s of the class's shaped rate: after connect the socket's receive window is clamped
  // to this × its round trip (daemon/network/fetch_window.hpp), which bounds what the fetch
  // queues upstream of the node. 0 leaves the window to the kernel.
  std::uint64_t window_rate = 0;
};

struct SocketTagEvent {
  int fd = -1;
  FetchClass cls = FetchClass::critical;
  bool new_connection = true;  // false: a kept-alive connection re-tagged for a new request
};

struct FetcherConfig {
  // Parts: a range is cut into parts of at most part_bytes, and into at least
  // connections_per_file parts (none smaller than min_part_bytes) so one big range uses
  // several connections.
  std::uint64_t part_bytes = 32ull << 20;
  std::uint64_t min_part_bytes = 1ull << 20;
  std::uint32_t connections_per_file = 8;
  std::uint32_t max_connections = 32;  // over all files
  // Background parts start only while no critical part is queued, running or backing off:
  // a cold start's bytes get every connection and the whole link, also on a node where
  // nothing in the kernel would make a background fetch yield (shaping off). A background
  // transfer already running when a critical request arrives goes on.
  bool background_waits_for_critical = true;

  // Retries: after a transient fault a part waits backoff_initial·2^(n-1) (capped at
  // backoff_max, with jitter in [50 %, 100 %]) and resumes from its last written byte.
  // A part fails after max_retries consecutive faults without progress; an attempt that
  // delivered bytes resets the count.
  std::uint32_t max_retries = 8;
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{5'000};

  std::chrono::milliseconds connect_timeout{5'000};
  // No byte for this long (while not paused by a rate limit) counts as a stalled transfer.
  std::chrono::milliseconds stall_timeout{10'000};

  std::array<RateLimit, kFetchClassCount> rate_limits{};
  std::array<SocketTags, kFetchClassCount> socket_tags{};
  // thawd's registry of live fetch sockets: when set, every connected socket is registered
  // (class, and model from its so_mark) and its receive window follows its class's current
  // share, instead of the fixed SocketTags::window_rate. Shared: it outlives the engine.
  std::shared_ptr<network::FetchWindows> fetch_windows;
  // Called (on the fetcher thread) after a socket was tagged; tests read the options back.
  std::function<void(const SocketTagEvent&)> on_socket_tagged;

  std::vector<std::string> http_headers;            // e.g. "Authorization: Bearer …"
  std::uint32_t receive_buffer_bytes = 256u << 10;  // CURLOPT_BUFFERSIZE
  std::uint32_t local_slice_bytes = 4u << 20;       // local copies: bytes per step
  std::uint64_t jitter_seed = 0;                    // 0: seeded from the clock
};

}  // namespace thaw::store
