// Clamping a model fetch socket's receive window to its class's rate × round trip.
//
// thaw shapes downloads on the node (IFB + HTB), but an unpaced registry sends a whole
// receive window back to back, and what exceeds the link rate queues in the upstream switch,
// ahead of any inference request on the same link. The receive window is the one lever a
// node has there: with a window of about one bandwidth-delay product a fetch keeps its rate
// while at most about one window waits upstream. Measured in the netns test
// (tests/network/traffic_shaper_netns_test.cpp): the autotuned window let 110–200 KB queue in
// the emulated uplink's buffer, the clamped one about one window (3–4 KB).
#pragma once

#include <cstdint>
#include <expected>
#include <string>

namespace thaw::network {

// Windows below this keep too few segments in flight for a fetch to keep its rate when the
// round trip read at connect is shorter than the path's under load; never below 3 segments
// (the connection's advertised MSS) either. 4 KB (3 Ethernet segments): on
// the netns test's 200 Mbit link (30 us round trip, so the floor decides) it kept 96 % of the
// unclamped shaped rate and left about 3 KB upstream, inference p99 1.3x idle; 8 KB left
// 8 KB upstream, p99 2.1x idle.
inline constexpr std::uint64_t kFetchWindowFloorBytes = 4u << 10;

struct FetchWindow {
  std::uint64_t bytes = 0;   // the window asked for (bpf/traffic_class.h thaw_fetch_window_bytes)
  std::uint32_t rtt_us = 0;  // the round trip it was computed from (TCP_INFO, smoothed)
  bool receive_buffer = false;  // SO_RCVBUF set too (false: above net.core.rmem_max)
};

// On a connected TCP socket: reads its round trip (TCP_INFO), computes the window for
// `rate_bytes_per_s` and sets TCP_WINDOW_CLAMP and SO_RCVBUF to it. Both, because on the
// kernels measured the clamp alone did not shrink the advertised window of a connection that
// had already offered a larger one; SO_RCVBUF does (and ends receive-buffer autotuning for
// the socket, which is what is wanted). SO_RCVBUF is left alone when the window is above
// net.core.rmem_max (the kernel would cap it below the BDP: a WAN fetch would lose rate).
// Call it after connect and before the request, and again when the class's rate changes.
std::expected<FetchWindow, std::string> clamp_fetch_window(
    int fd, std::uint64_t rate_bytes_per_s, std::uint64_t floor_bytes = kFetchWindowFloorBytes);

}  // namespace thaw::network
