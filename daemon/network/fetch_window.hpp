// Clamping a model fetch socket's receive window to its class's rate × round trip.
//
// thaw shapes downloads on the node (IFB + HTB), but an unpaced registry sends a whole
// receive window back to back, and what exceeds the link rate queues in the upstream switch,
// ahead of any inference request on the same link. The receive window is the one lever a
// node has there: with a window of about one bandwidth-delay product a fetch keeps its rate
// while at most about one window waits upstream. Measured in the netns test
// (tests/network/traffic_shaper_netns_test.cpp): the autotuned window let 110–200 KB queue in
// the emulated uplink's buffer, the clamped one about one window (3–4 KB).
//
// FetchWindows keeps every live fetch socket's window at its class's *current* share: the
// critical class's rate split over its live fetches, a background fetch's window cut to its
// class's guaranteed rate while any critical fetch is live. The store registers its sockets
// (FetcherConfig::fetch_windows), thawd sets the rates when shaping starts and when the
// coordinator changes them.
//
// A clamped window costs a fetch goodput when nothing competes with it (a late-reading
// receiver thread idles the link: 83 vs 117 MB/s on an idle 1 Gbit/s veth, -36 % at 1.25
// GB/s; bench/store/fetch_classified.sh). So thawd clamps only while there is something to
// protect (ClampWhen::contended): inference traffic on the link (thawd samples the
// classifier's inference counter, InferenceActivity), or fetches of more than one (class,
// model) at once, which must share the link by HTB's rates rather than by whose packets
// filled the upstream queue first. Otherwise every socket is left to the kernel's
// autotuning, and a socket clamped before is released (its receive buffer raised back to
// where autotuning would have taken it).
#pragma once

#include <array>
#include <cstdint>
#include <expected>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace thaw::network {

// Windows below this keep too few segments in flight for a fetch to keep its rate when the
// round trip read at connect is shorter than the path's under load; never below 3 segments
// (the connection's advertised MSS) either. 4 KB (3 Ethernet segments): on
// the netns test's 200 Mbit link (30 us round trip, so the floor decides) it kept 96 % of the
// unclamped shaped rate and left about 3 KB upstream, inference p99 1.3x idle; 8 KB left
// 8 KB upstream, p99 2.1x idle.
inline constexpr std::uint64_t kFetchWindowFloorBytes = 4u << 10;

// The round trip a window is computed from is never taken below this. The round trip TCP
// measured at connect leaves out how late the receiving thread reads, and with SO_RCVBUF at
// the window a late reader stops the sender: on a veth at 1.25 GB/s with the 2-core machine
// loaded, thawd's 2.09 GB fetch took 12-21 s with windows from the connect round trip (20-30
// us) against 2.8-5.8 s unclamped; 100 us: 7.0-7.5 s; 190 us: 4.6-5.1 s (unclamped 3.7-5.4);
// 250 us: 4.3-5.8 s (bench/store/fetch_classified.sh). But a saturating fetch queues about
// one window upstream, i.e. about this long at the link rate, ahead of inference: on the
// netns test's 200 Mbit link 250 us (5.6 KB windows) put inference p99 at 1.5-1.7x idle in
// one run of 8, while 190 us keeps its windows at the 3-segment floor (p99 1.0-1.5x). The
// trade is between those two; TCP_WINDOW_CLAMP alone (or with a larger SO_RCVBUF) bounded
// nothing on the development kernel (80-210 KB upstream, p99 9-14x).
inline constexpr std::uint32_t kFetchWindowMinRttUs = 190;

struct FetchWindow {
  std::uint64_t bytes = 0;   // the window asked for (bpf/traffic_class.h thaw_fetch_window_bytes)
  std::uint32_t rtt_us = 0;  // the round trip it was computed from (TCP_INFO, smoothed;
                             // at least kFetchWindowMinRttUs)
  bool receive_buffer = false;  // SO_RCVBUF set too (false: above net.core.rmem_max)
};

// On a connected TCP socket: reads its round trip (TCP_INFO), computes the window for
// `rate_bytes_per_s` and sets TCP_WINDOW_CLAMP and SO_RCVBUF to it. Both, because on the
// kernels measured the clamp alone did not shrink the advertised window of a connection that
// had already offered a larger one; SO_RCVBUF does (and ends receive-buffer autotuning for
// the socket, which is what is wanted). SO_RCVBUF is left alone when the window is above
// net.core.rmem_max (the kernel would cap it below the BDP: a WAN fetch would lose rate).
// Call it after connect and before the request, and again when the class's rate changes.
// `rtt_us` 0: read from TCP_INFO; else that round trip (a re-clamp reuses the one read at
// connect, which no queue of the fetch's own had inflated yet).
// `min_segments`: the window is never below that many of the connection's segments.
std::expected<FetchWindow, std::string> clamp_fetch_window(
    int fd, std::uint64_t rate_bytes_per_s, std::uint64_t floor_bytes = kFetchWindowFloorBytes,
    std::uint32_t rtt_us = 0, std::uint32_t min_segments = 3);

// A background fetch's window while a critical one lives: 2 segments, below the usual floor.
// In the netns yield test (200 Mbit/s, load average about 4) the critical fetch got 89-92 %
// of the link next to a background window of 3 segments, 92-95 % next to one of 2 (HTB's
// guaranteed 5 % is background's either way), and the background fetch was back at the
// link's rate within 0.5 s of the critical one's end: 2 segments keep a full segment
// advertised, so the sender never waits on its persist timer (which a window under one
// segment would make it do).
inline constexpr std::uint32_t kYieldWindowSegments = 2;

// Class ids as in bpf/traffic_class.h (THAW_CLASS_CRITICAL_FETCH, THAW_CLASS_BACKGROUND_FETCH).
inline constexpr int kWindowClassCritical = 1;
inline constexpr int kWindowClassBackground = 2;

// The rates fetch windows follow, bytes/s (0: that class's windows are left to the kernel).
struct FetchWindowRates {
  std::uint64_t critical = 0;    // the critical class's ceiling: what its fetches may take
  std::uint64_t background = 0;  // the background class's ceiling, used while no critical runs
  // The background class's guaranteed rate: its fetches' windows while a critical one runs.
  std::uint64_t background_yield = 0;
  bool operator==(const FetchWindowRates&) const = default;
};

// The rate one fetch socket's window is computed from: its class's rate over the class's live
// fetch sockets; a background socket gets background_yield's share while critical ones live.
// 0: leave the window alone.
std::uint64_t fetch_window_rate(int traffic_class, std::uint32_t live_critical,
                                std::uint32_t live_background, const FetchWindowRates& rates);

// Live fetch sockets and their windows. Thread-safe: fetchers register and unregister from
// their threads, thawd sets rates from another; setsockopt on a registered fd happens under
// the lock, and a fetcher unregisters before it closes the fd.
// When FetchWindows clamps: always (at the class rates), or only while contended (above).
enum class ClampWhen { always, contended };

// Releases a clamped socket back to a window as large as autotuning would reach: its receive
// buffer to net.ipv4.tcp_rmem's maximum (SO_RCVBUFFORCE, which needs CAP_NET_ADMIN, as
// shaping does; else SO_RCVBUF, capped at net.core.rmem_max) and TCP_WINDOW_CLAMP to match.
// Once SO_RCVBUF was set the kernel no longer autotunes the socket, so this is the way back.
std::expected<void, std::string> release_fetch_window(int fd);

class FetchWindows {
 public:
  explicit FetchWindows(FetchWindowRates rates = {}, ClampWhen when = ClampWhen::always)
      : rates_(rates), when_(when) {}
  FetchWindows(const FetchWindows&) = delete;
  FetchWindows& operator=(const FetchWindows&) = delete;

  // Unregisters on destruction (before the socket is closed).
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& o) noexcept : owner_(o.owner_), id_(o.id_) { o.owner_ = nullptr; }
    Registration& operator=(Registration&& o) noexcept;
    ~Registration() { reset(); }
    void reset();
    explicit operator bool() const { return owner_ != nullptr; }

   private:
    friend class FetchWindows;
    Registration(FetchWindows* owner, std::uint64_t id) : owner_(owner), id_(id) {}
    FetchWindows* owner_ = nullptr;
    std::uint64_t id_ = 0;
  };

  // A connected fetch socket of `traffic_class` carrying `model` (0: none): its window is set
  // now, and the other live sockets' windows follow the new count. An error (the socket's own
  // setsockopt) registers nothing.
  std::expected<Registration, std::string> add(int fd, int traffic_class, std::uint32_t model = 0);
  // New class rates: every live socket is re-clamped. The first error, if any, is returned
  // (the other sockets are still re-clamped).
  std::expected<void, std::string> set_rates(const FetchWindowRates& rates);
  FetchWindowRates rates() const;
  // Whether inference traffic runs on the link now (ClampWhen::contended: thawd's sampling of
  // the classifier). A change re-clamps or releases the live sockets.
  void set_inference_active(bool active);
  // Whether the windows are clamped now (always, or contended at this moment).
  bool clamping() const;

  struct Live {
    int fd = -1;
    int traffic_class = 0;
    std::uint32_t model = 0;
    FetchWindow window;  // as last set (bytes 0: left to the kernel)
  };
  std::vector<Live> live() const;
  // Re-clamps that failed on a socket other than the one being added (e.g. closed by the
  // peer in between): counted, the last message kept, as nobody waits on them.
  std::uint64_t reclamp_errors() const;
  std::string last_error() const;

 private:
  void remove(std::uint64_t id);
  // Under mutex_: re-clamps every live socket (but except_id) whose window rate changed.
  std::expected<void, std::string> reclamp_locked(std::uint64_t except_id);
  bool clamping_locked() const;
  std::uint64_t rate_for_locked(int traffic_class) const;
  std::expected<FetchWindow, std::string> clamp_locked(int fd, int traffic_class,
                                                       std::uint64_t rate,
                                                       std::uint32_t rtt_us) const;

  struct Entry {
    Live live;
    std::uint64_t rate = 0;            // the rate its window was last computed from
    std::uint32_t rtt_used = 0;        // and the round trip
    std::uint32_t connect_rtt_us = 0;  // TCP_INFO's at registration (0: unreadable)
    std::string peer;                  // the registry's address ("" if unknown)
  };
  // The round trip a socket's window is computed from: the lowest any live socket to the
  // same address measured at connect. A socket that connected while another fetch's
  // unclamped window filled the upstream queue measured that queue too (1.5-2.7 ms against
  // 190 us on the netns link), and a window from it let that fetch take 58-60 % of a link
  // two models' fetches should share 50/50.
  std::uint32_t path_rtt_locked(const Entry& e) const;
  mutable std::mutex mutex_;
  FetchWindowRates rates_;
  ClampWhen when_;
  bool inference_active_ = false;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_id_ = 1;
  std::uint64_t reclamp_errors_ = 0;
  std::string last_error_;
};

}  // namespace thaw::network
