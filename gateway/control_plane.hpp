// ControlPlane: everything the gateway asks of the cluster's coordinator, behind one narrow
// interface so the gateway's logic is tested with a fake (tests/gateway) and runs standalone
// with static routes. Route updates travel the other way: the implementation calls
// Router::replace when the coordinator pushes a table.
#pragma once

#include <string>
#include <vector>

#include "gateway/router.hpp"

namespace thaw::gateway {

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  // Asks for a cold start of `model`; returns at once (the answer is a route push).
  virtual void request_cold_start(const std::string& model) = 0;
  // The last window's load of every model this gateway knows.
  virtual void report_load(const std::vector<ModelLoadSample>& samples) = 0;
};

// --route model=url: a fixed table, no coordinator. Cold starts cannot be asked for; a model
// without a serving worker is held until its deadline and answered 503.
class StaticControlPlane final : public ControlPlane {
 public:
  void request_cold_start(const std::string&) override {}
  void report_load(const std::vector<ModelLoadSample>&) override {}
};

}  // namespace thaw::gateway
