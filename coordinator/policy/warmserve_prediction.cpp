#include "coordinator/policy/warmserve_prediction.hpp"

#include <algorithm>
#include <cmath>

namespace thaw::coordinator::policy {

std::optional<double> seasonal_component(std::span<const double> series, std::size_t t,
                                         const CspConfig& config) {
  const std::size_t day = config.windows_per_day;
  if (day == 0) return std::nullopt;
  double sum = 0;
  std::size_t days = 0;
  for (std::size_t j = 1; j <= config.history_days && j * day <= t; ++j) {
    if (t - j * day >= series.size()) continue;
    sum += series[t - j * day];
    ++days;
  }
  if (days == 0) return std::nullopt;
  return sum / static_cast<double>(days);
}

double correction(std::span<const double> series, std::size_t t, const CspConfig& config) {
  const std::size_t n = config.lookback;
  double weighted = 0;
  double weights = 0;
  for (std::size_t j = 1; j <= n && j <= t; ++j) {
    const std::size_t at = t - j;
    if (at >= series.size()) continue;
    const auto p = seasonal_component(series, at, config);
    if (!p) continue;
    const double w = config.recent_errors_weigh_most ? std::ldexp(1.0, static_cast<int>(n - j))
                                                     : std::ldexp(1.0, static_cast<int>(j - 1));
    weighted += (series[at] - *p) * w;
    weights += w;
  }
  return weights == 0 ? 0.0 : weighted / weights;
}

std::optional<double> predict_load(std::span<const double> series, std::size_t t,
                                   const CspConfig& config) {
  const auto p = seasonal_component(series, t, config);
  if (!p) return std::nullopt;
  return std::max(0.0, *p + correction(series, t, config));
}

std::vector<ReplicaScore> prewarm_replicas(const ReplicaDemand& d) {
  if (d.batch_size == 0) return {};
  const auto need = [&](double load) {
    return static_cast<std::int64_t>(std::ceil(std::max(0.0, load) / d.batch_size));
  };
  const std::int64_t k = d.active_instances;
  const std::int64_t basic = std::max<std::int64_t>(need(d.average_load) - k, 0);
  const std::int64_t burst = std::max<std::int64_t>(need(d.peak_load) - basic - k, 0);
  const double total = static_cast<double>(basic + burst);
  std::vector<ReplicaScore> out;
  for (std::int64_t i = 0; i < basic; ++i) {
    out.push_back({false, static_cast<std::uint32_t>(i),
                   std::exp(-static_cast<double>(i) / total) * d.cold_start_seconds});
  }
  const double burstiness = (d.peak_load - d.average_load) / std::max(d.average_load, 1.0);
  for (std::int64_t i = 0; i < burst; ++i) {
    out.push_back(
        {true, static_cast<std::uint32_t>(i),
         std::exp(-static_cast<double>(basic + i) / total) * d.cold_start_seconds * burstiness});
  }
  return out;
}

double kv_reservation_target(double kv_capacity, std::uint32_t running_requests,
                             std::uint32_t max_batch, double kv_in_use) {
  if (max_batch == 0) return kv_capacity;  // no batch size known: keep everything
  const double c = static_cast<double>(max_batch);
  return std::max(kv_capacity * running_requests / c, kv_in_use + kv_capacity / c);
}

}  // namespace thaw::coordinator::policy
