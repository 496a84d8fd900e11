#include "coordinator/cluster/class_rate_dispatch.hpp"

namespace thaw::coordinator {

std::uint32_t running_cold_starts(const v1::Register& report) {
  std::uint32_t n = 0;
  for (const v1::TaskStatus& t : report.tasks()) {
    n += t.task().kind() == v1::TASK_FETCH && t.state() == v1::TASK_RUNNING;
  }
  return n;
}

double node_link_bytes_per_s(const v1::Register& report) {
  return report.network_bytes_per_s() > 0 ? report.network_bytes_per_s() : 16e9 / 8;
}

v1::CoordinatorMessage class_rates_message(const policy::NodeClassRates& rates) {
  v1::CoordinatorMessage m;
  v1::ClassRates* r = m.mutable_class_rates();
  r->set_link_bytes_per_s(rates.link_bytes_per_s);
  r->set_cold_starts(rates.cold_starts);
  r->set_per_cold_start_bytes_per_s(rates.per_cold_start);
  if (rates.cold_starts > 0 && rates.link_bytes_per_s > 0) {
    for (const policy::ClassRate& c : rates.classes) {
      v1::ClassRate* out = r->add_classes();
      out->set_rate_bytes_per_s(c.rate);
      out->set_ceil_bytes_per_s(c.ceil);
    }
  }
  return m;
}

std::vector<Outbound> ClassRateDispatch::updates(const std::map<std::string, NodeRecord>& nodes,
                                                 double now) {
  std::vector<Outbound> out;
  if (now - last_walk_ < min_interval_s_) return out;
  last_walk_ = now;
  for (const auto& [id, node] : nodes) {
    if (!node.alive) continue;
    const std::uint32_t n = running_cold_starts(node.report);
    const double link = node_link_bytes_per_s(node.report);
    auto it = sent_.find(id);
    const bool known = it != sent_.end();
    const bool changed = known ? it->second.cold_starts != n || it->second.link != link : n > 0;
    const bool refresh = known && n > 0 && now - it->second.at >= resend_s_;
    if (!changed && !refresh) continue;
    out.push_back({id, class_rates_message(policy::node_class_rates(link, n, reserve_))});
    if (n == 0) {
      sent_.erase(id);  // back on its own rates: nothing to repeat
    } else {
      sent_[id] = Sent{n, link, now};
    }
  }
  // Nodes gone from the map (or dead) are forgotten: a node that comes back starts afresh.
  for (auto it = sent_.begin(); it != sent_.end();) {
    auto node = nodes.find(it->first);
    it = node == nodes.end() || !node->second.alive ? sent_.erase(it) : std::next(it);
  }
  return out;
}

}  // namespace thaw::coordinator
