// ClassRateDispatch: sends each live node the rates its traffic shaper should give its
// classes (ClassRates, cluster.proto) from the cold starts running there
// (policy/hydraserve_class_rates.hpp): when their number N changes, and again every
// `resend_s` while N > 0 so a thawd that restarted in between gets them. Nodes that reached
// N = 0 get one message without classes (back to their own [network] rates). It looks at
// most every `min_interval_s`: the server calls it after every tick (up to 100 a second),
// and a walk over 1,000 nodes costs about 0.4 ms.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/cluster/cluster_state.hpp"
#include "coordinator/policy/hydraserve_class_rates.hpp"

namespace thaw::coordinator {

// Cold starts a node is running: its fetch tasks still running (a stage's, or the rest of
// the model at background class once the stage is in: both hold the node's link).
std::uint32_t running_cold_starts(const v1::Register& report);

// The link B a node's rates are computed with: what it reported, else the 16 Gbit/s the
// placement assumes too.
double node_link_bytes_per_s(const v1::Register& report);

v1::CoordinatorMessage class_rates_message(const policy::NodeClassRates& rates);

class ClassRateDispatch {
 public:
  explicit ClassRateDispatch(policy::ClassReserve reserve = {}, double resend_s = 30,
                             double min_interval_s = 0.25)
      : reserve_(reserve), resend_s_(resend_s), min_interval_s_(min_interval_s) {}

  std::vector<Outbound> updates(const std::map<std::string, NodeRecord>& nodes, double now);

 private:
  struct Sent {
    std::uint32_t cold_starts = 0;
    double link = 0;
    double at = 0;
  };
  policy::ClassReserve reserve_;
  double resend_s_;
  double min_interval_s_;
  double last_walk_ = -1e300;
  std::map<std::string, Sent> sent_;
};

}  // namespace thaw::coordinator
