#include "coordinator/policy/hydraserve_class_rates.hpp"

#include <cmath>

namespace thaw::coordinator::policy {

namespace {

bool usable(const ClassReserve& r) {
  for (double v : {r.inference, r.background, r.other}) {
    if (!std::isfinite(v) || v < 0) return false;
  }
  return r.inference + r.background + r.other < 1;
}

}  // namespace

NodeClassRates node_class_rates(double link, std::uint32_t cold_starts,
                                const ClassReserve& requested) {
  NodeClassRates out;
  out.cold_starts = cold_starts;
  if (!std::isfinite(link) || link <= 0) return out;
  out.link_bytes_per_s = link;
  if (cold_starts == 0) return out;
  const ClassReserve r = usable(requested) ? requested : ClassReserve{};
  auto at = [&](NetClass c) -> ClassRate& { return out.classes[static_cast<std::size_t>(c)]; };
  at(NetClass::inference).rate = link * r.inference;
  at(NetClass::background_fetch).rate = link * r.background;
  at(NetClass::other).rate = link * r.other;
  // B_c: the link less the reserves, computed as a difference so the four add up to B.
  at(NetClass::critical_fetch).rate = link - at(NetClass::inference).rate -
                                      at(NetClass::background_fetch).rate -
                                      at(NetClass::other).rate;
  for (ClassRate& c : out.classes) c.ceil = link;
  // Eq. 4's equal share: each of the N cold starts fetches at B_c / N.
  out.per_cold_start = at(NetClass::critical_fetch).rate / cold_starts;
  return out;
}

double cold_start_fetch_bytes_per_s(double link, bool shaped, const ClassReserve& reserve) {
  if (!std::isfinite(link) || link <= 0) return 0;
  if (!shaped) return link;
  return node_class_rates(link, 1, reserve)
      .classes[static_cast<std::size_t>(NetClass::critical_fetch)]
      .rate;
}

}  // namespace thaw::coordinator::policy
