// Per-class rates of one node's traffic shaper from the cold starts placed on it
// (HydraServe §4.2). The paper's network-contention model shares a GPU server's bandwidth B
// equally among its N cold-start workers (Eq. 3's B/(N+1) for a newcomer, Eq. 4's B/N while
// they run) and notes that simply prioritising inference packets solves the contention
// between fetching and inference. thaw makes the node's shaper enforce that model: while
// cold starts run there, the critical-fetch class is guaranteed everything but small
// reserves for inference, background fetches and other traffic, so each of the N cold starts
// gets B_c/N; with none, the node's own [network] rates apply. Every ceiling is the link, so
// no bandwidth idles (HTB lends by priority: inference first, then critical fetch).
// Pure arithmetic, shared with the simulator; rates in bytes per second.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace thaw::coordinator::policy {

// Class ids as bpf/traffic_class.h numbers them.
enum class NetClass : std::size_t {
  inference = 0,
  critical_fetch = 1,
  background_fetch = 2,
  other = 3
};
inline constexpr std::size_t kNetClasses = 4;

// Shares of B guaranteed to the classes that are not cold starts' while cold starts run.
struct ClassReserve {
  double inference = 0.10;   // requests and responses: small, and served first anyway
  double background = 0.02;  // consolidation keeps moving, slowly
  double other = 0.05;       // the node's own traffic (ssh, monitoring) never starves
};

struct ClassRate {
  double rate = 0;  // guaranteed
  double ceil = 0;
};

struct NodeClassRates {
  double link_bytes_per_s = 0;    // B
  std::uint32_t cold_starts = 0;  // N
  double per_cold_start = 0;      // B_c / N: what each cold start's fetch gets (0 when N = 0)
  // By class; all zero when N = 0 (the node's configured rates apply).
  std::array<ClassRate, kNetClasses> classes{};
};

// The rates for a node of link B running N cold starts. A reserve that is negative, not
// finite, or reserves that add up to 1 or more are replaced by the defaults (the critical
// class must keep a positive share); B <= 0 gives all zero (unknown link: nothing to set).
NodeClassRates node_class_rates(double link_bytes_per_s, std::uint32_t cold_starts,
                                const ClassReserve& reserve = {});

// The bandwidth Eq. 3/4 may count on for the cold starts' fetches on a node of link B. On a
// node that shapes (it applies the rates above), the fetches are guaranteed the critical
// class's B_c and no more once inference traffic takes its reserve: B_c is what the N
// workers share (N does not change B_c). On a node that does not shape nothing reserves
// anything for the others, and the paper's model applies: the whole B. B <= 0 gives 0.
double cold_start_fetch_bytes_per_s(double link_bytes_per_s, bool shaped,
                                    const ClassReserve& reserve = {});

}  // namespace thaw::coordinator::policy
