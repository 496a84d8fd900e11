// thawctl's commands; each returns the exit code (bus_client.hpp) or throws Failure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "bus_client.hpp"

namespace thawctl {

struct Options {
  bool json = false;
  bool wait = true;            // fetch/prewarm: follow until done
  double timeout_s = 0;        // wait: 0 = forever
  std::optional<int> gpu;      // prewarm
  std::optional<int> layers;   // prewarm: only embeddings and the first k layers
  std::uint64_t kv_bytes = 0;  // activate: 0 = what is free
};

int status(sd_bus* bus, const Options& o);
int gpus(sd_bus* bus, const Options& o);
int slots(sd_bus* bus, const Options& o);
int models(sd_bus* bus, const Options& o);
int fetch(sd_bus* bus, const std::string& model, const Options& o);
int prewarm(sd_bus* bus, const std::string& model, const Options& o);
int slot_action(sd_bus* bus, const char* method, const std::string& slot, const Options& o);
int wait_model(sd_bus* bus, const std::string& model, const Options& o);
// Engines' recorded artifacts, of `model` (its cache key or registry name) or "" for all.
int artifacts(sd_bus* bus, const std::string& model, const Options& o);
// Traffic shaping on the uplink: on/off and why, rates per class and their source, counters.
int net(sd_bus* bus, const Options& o);

}  // namespace thawctl
