// The thaw_net_* families: every class and direction, the values of the status given.
#include <gtest/gtest.h>

#include "daemon/metrics/openmetrics.hpp"

namespace thaw::daemon {
namespace {

TEST(NetworkMetrics, EveryClassAndDirectionWithItsValues) {
  NetStatus n;
  n.enabled = true;
  n.link_bytes_per_s = 1'250'000'000;
  n.cold_starts = 3;
  n.classes[1].rate_bytes_per_s = 1'000'000'000;
  n.classes[1].ceil_bytes_per_s = 1'250'000'000;
  n.classes[1].bytes = {1200, 987654321};
  n.classes[1].packets = {20, 700000};
  n.classes[2].drops = {0, 17};
  const std::string text = render_network_openmetrics(n);
  for (const char* line : {
           "thaw_net_shaping_enabled 1\n",
           "thaw_net_link_bytes_per_second 1250000000\n",
           "thaw_net_cold_starts 3\n",
           "thaw_net_class_rate_bytes_per_second{class=\"critical_fetch\"} 1000000000\n",
           "thaw_net_class_ceil_bytes_per_second{class=\"critical_fetch\"} 1250000000\n",
           "thaw_net_class_bytes_total{class=\"critical_fetch\",direction=\"ingress\"} 987654321\n",
           "thaw_net_class_bytes_total{class=\"critical_fetch\",direction=\"egress\"} 1200\n",
           "thaw_net_class_packets_total{class=\"critical_fetch\",direction=\"ingress\"} 700000\n",
           "thaw_net_class_drops_total{class=\"background_fetch\",direction=\"ingress\"} 17\n",
           "thaw_net_class_drops_total{class=\"other\",direction=\"egress\"} 0\n",
           "thaw_net_class_bytes_total{class=\"inference\",direction=\"egress\"} 0\n",
           "# TYPE thaw_net_class_bytes counter\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin:\n" << text;
  }
  EXPECT_EQ(text.find("# EOF"), std::string::npos);
  EXPECT_EQ(text.find("thaw_net_fetch_windows_clamped"), std::string::npos)
      << "no family while the windows are off";
  n.fetch_windows_clamped = true;
  EXPECT_NE(render_network_openmetrics(n).find("thaw_net_fetch_windows_clamped 1\n"),
            std::string::npos);
  n.enabled = false;
  EXPECT_NE(render_network_openmetrics(n).find("thaw_net_shaping_enabled 0\n"), std::string::npos);
}

TEST(NetworkMetrics, ModelsCountedApartByName) {
  NetStatus n;
  n.enabled = true;
  EXPECT_EQ(render_network_openmetrics(n).find("thaw_net_model_bytes"), std::string::npos)
      << "no family without models";
  n.models = {{1, "org/llama-3-8b", 123456789}, {2, "gpt2", 42}, {3, "odd\"name", 7}};
  const std::string text = render_network_openmetrics(n);
  for (const char* line : {
           "# TYPE thaw_net_model_bytes counter\n",
           "thaw_net_model_bytes_total{model=\"org/llama-3-8b\"} 123456789\n",
           "thaw_net_model_bytes_total{model=\"gpt2\"} 42\n",
           "thaw_net_model_bytes_total{model=\"odd\\\"name\"} 7\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin:\n" << text;
  }
}

}  // namespace
}  // namespace thaw::daemon
