#include "daemon/agent/startup_meter.hpp"

#include <time.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace thaw::daemon {
namespace {

// Folds `value` into the running mean `mean` of `n` values (n counts this one).
double running_mean(double mean, double value, std::uint32_t n) {
  return mean + (value - mean) / n;
}

}  // namespace

std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

StartupPhases phases_from_timeline(const std::filesystem::path& timeline, std::uint64_t launched_ns,
                                   double ready_s) {
  StartupPhases out;
  out.ready_s = ready_s;
  std::ifstream in(timeline);
  // The first time each event was seen (an engine core process may repeat some).
  std::map<std::string, std::uint64_t> at;
  std::string line;
  for (int lines = 0; lines < 10'000 && std::getline(in, line); ++lines) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("event") || !j["event"].is_string() || !j.contains("t_ns") ||
        !j["t_ns"].is_number_unsigned()) {
      continue;  // not a timeline line (the engine's other output)
    }
    at.try_emplace(j["event"].get<std::string>(), j["t_ns"].get<std::uint64_t>());
  }
  const auto span = [&](std::uint64_t from, const char* to) -> std::optional<double> {
    auto it = at.find(to);
    if (it == at.end() || it->second < from) return std::nullopt;
    return static_cast<double>(it->second - from) / 1e9;
  };
  auto start = at.find("process_start");
  if (start == at.end() || start->second < launched_ns) return out;
  out.process_start_s = static_cast<double>(start->second - launched_ns) / 1e9;
  out.cuda_init_s = span(start->second, "driver_init");
  if (auto d = at.find("driver_init"); d != at.end())
    out.weights_s = span(d->second, "weights_loaded");
  if (auto w = at.find("weights_loaded"); w != at.end())
    out.engine_init_s = span(w->second, "ready");
  return out;
}

void StartupMeter::record(const StartupPhases& p) {
  std::lock_guard lock(mutex_);
  const std::uint32_t n = costs_.samples() + 1;
  costs_.set_samples(n);
  costs_.set_ready_s(running_mean(costs_.ready_s(), p.ready_s, n));
  // The engine's phases count only for starts whose engine reported all of them, so the
  // four averages describe the same starts.
  if (!p.process_start_s || !p.cuda_init_s || !p.weights_s || !p.engine_init_s) return;
  const std::uint32_t k = costs_.phase_samples() + 1;
  costs_.set_phase_samples(k);
  costs_.set_process_start_s(running_mean(costs_.process_start_s(), *p.process_start_s, k));
  costs_.set_cuda_init_s(running_mean(costs_.cuda_init_s(), *p.cuda_init_s, k));
  costs_.set_weights_s(running_mean(costs_.weights_s(), *p.weights_s, k));
  costs_.set_engine_init_s(running_mean(costs_.engine_init_s(), *p.engine_init_s, k));
}

v1::StartupCosts StartupMeter::averages() const {
  std::lock_guard lock(mutex_);
  return costs_;
}

}  // namespace thaw::daemon
