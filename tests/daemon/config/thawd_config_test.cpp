// thawd.toml: defaults, every key, the shipped example, and errors that name file, line,
// column and key.
#include "daemon/config/thawd_config.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace thaw::daemon {
namespace {

TEST(ThawdConfig, EmptyFileGivesTheDefaults) {
  auto c = parse_config("", "empty.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(*c, ThawdConfig{});
  EXPECT_EQ(c->cache_budget_bytes, 64ull << 30);
  EXPECT_EQ(c->socket_path, "/run/thaw/thawd.sock");
}

TEST(ThawdConfig, TheShippedExampleIsTheDefaults) {
  auto c = load_config(THAW_SOURCE_DIR "/packaging/thawd.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(*c, ThawdConfig{});
}

TEST(ThawdConfig, MissingFileGivesTheDefaults) {
  auto c = load_config("/nonexistent/thawd.toml");
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, ThawdConfig{});
}

TEST(ThawdConfig, EveryKeyIsRead) {
  auto c = parse_config(R"(
[node]
id = "gpu-7"
state_dir = "/srv/thaw-state"
[store]
cache_dir = "/dev/shm/thaw"
cache_budget = "1.5GiB"
registry = "http://127.0.0.1:8080/models"
connections = 16
[gpu]
pool_share = 0.5
max_slots = 3
[shim]
socket = "/tmp/t.sock"
allow_groups = ["thaw", "ml"]
[dbus]
bus = "unix:path=/tmp/bus"
[metrics]
listen = "127.0.0.1:9400"
)",
                        "full.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->node_id, "gpu-7");
  EXPECT_EQ(c->state_dir, "/srv/thaw-state");
  EXPECT_EQ(c->cache_dir, "/dev/shm/thaw");
  EXPECT_EQ(c->cache_budget_bytes, 3ull << 29);
  EXPECT_EQ(c->registry, "http://127.0.0.1:8080/models");
  EXPECT_EQ(c->connections, 16u);
  EXPECT_DOUBLE_EQ(c->pool_share, 0.5);
  EXPECT_EQ(c->max_slots, 3u);
  EXPECT_EQ(c->socket_path, "/tmp/t.sock");
  EXPECT_EQ(c->allow_groups, (std::vector<std::string>{"thaw", "ml"}));
  EXPECT_EQ(c->bus, "unix:path=/tmp/bus");
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9400");

  auto bytes = parse_config("[store]\ncache_budget = 1048576\n", "b.toml");
  ASSERT_TRUE(bytes);
  EXPECT_EQ(bytes->cache_budget_bytes, 1048576u);
}

TEST(ThawdConfig, ErrorsNameFileLineKeyAndFix) {
  struct Case {
    const char* text;
    const char* needles[3];
  };
  const Case cases[] = {
      {"[store]\ncache_budgte = \"1GiB\"\n", {"bad.toml:2:1", "store.cache_budgte", "unknown key"}},
      {"[stor]\nx = 1\n", {"bad.toml:1:1", "stor", "unknown section"}},
      {"registry = \"x\"\n", {"bad.toml:1:1", "registry", "section"}},
      {"[store]\ncache_budget = \"lots\"\n", {":2:", "store.cache_budget", "64GiB"}},
      {"[store]\ncache_budget = -5\n", {":2:", "store.cache_budget", "> 0"}},
      {"[store]\nconnections = 0\n", {":2:", "store.connections", "1..256"}},
      {"[store]\nconnections = \"8\"\n", {":2:", "store.connections", "integer"}},
      {"[store]\ncache_dir = \"relative/dir\"\n", {":2:", "store.cache_dir", "absolute"}},
      {"[node]\nstate_dir = \"state\"\n", {":2:", "node.state_dir", "absolute"}},
      {"[gpu]\npool_share = 1.5\n", {":2:", "gpu.pool_share", "(0, 1]"}},
      {"[shim]\nallow_groups = \"thaw\"\n", {":2:", "shim.allow_groups", "array"}},
      {"[shim]\nallow_groups = [\"thaw\", 3]\n", {":2:", "shim.allow_groups", "group name"}},
      {"[dbus]\nbus = \"sytem\"\n", {":2:", "dbus.bus", "\"system\""}},
      {"[metrics]\nlisten = \"0.0.0.0:9400\"\n", {":2:", "metrics.listen", "loopback"}},
      {"[metrics]\nlisten = \"127.0.0.1:99999\"\n", {":2:", "metrics.listen", "loopback"}},
      {"[store\n", {"bad.toml:1:", "TOML", "fix"}},
  };
  for (const Case& c : cases) {
    auto parsed = parse_config(c.text, "bad.toml");
    ASSERT_FALSE(parsed) << c.text;
    for (const char* needle : c.needles) {
      EXPECT_NE(parsed.error().message.find(needle), std::string::npos)
          << "'" << needle << "' missing from: " << parsed.error().message;
    }
    EXPECT_EQ(parsed.error().message.find('\n'), std::string::npos) << parsed.error().message;
  }
}

TEST(ThawdConfig, NonFiniteNumbersAreRefused) {
  // NaN fails every comparison, so it passed a "not outside (0, 1]" check and thawd aborted
  // sizing the GPU pool; TOML spells it nan, +nan, -nan, and infinities inf, +inf, -inf.
  for (const char* value : {"nan", "+nan", "-nan", "inf", "+inf", "-inf"}) {
    const std::string text = std::string("[gpu]\npool_share = ") + value + "\n";
    auto parsed = parse_config(text, "bad.toml");
    ASSERT_FALSE(parsed) << value;
    EXPECT_NE(parsed.error().message.find("bad.toml:2:"), std::string::npos)
        << parsed.error().message;
    EXPECT_NE(parsed.error().message.find("gpu.pool_share"), std::string::npos)
        << parsed.error().message;
    EXPECT_NE(parsed.error().message.find("finite"), std::string::npos) << parsed.error().message;
  }
  auto fine = parse_config("[gpu]\npool_share = 1\n", "ok.toml");
  ASSERT_TRUE(fine) << fine.error().message;
  EXPECT_EQ(fine->pool_share, 1.0);
}

TEST(ThawdConfig, ACacheBudgetBelowOneMiBIsRefused) {
  // "1" is a typo for a size, and the start-up re-index would evict everything cached.
  for (const char* value : {"1", "\"1\"", "\"1KiB\"", "\"1048575B\""}) {
    const std::string text = std::string("[store]\ncache_budget = ") + value + "\n";
    auto parsed = parse_config(text, "bad.toml");
    ASSERT_FALSE(parsed) << value;
    EXPECT_NE(parsed.error().message.find("store.cache_budget"), std::string::npos);
    EXPECT_NE(parsed.error().message.find("at least \"1MiB\""), std::string::npos)
        << parsed.error().message;
  }
  auto smallest = parse_config("[store]\ncache_budget = \"1MiB\"\n", "ok.toml");
  ASSERT_TRUE(smallest) << smallest.error().message;
  EXPECT_EQ(smallest->cache_budget_bytes, kMinCacheBudgetBytes);
}

TEST(ThawdConfig, AMissingFileGivenExplicitlyIsAnError) {
  auto c = load_config("/nonexistent/thawd.toml", ConfigFile::required);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("/nonexistent/thawd.toml: no such file"), std::string::npos)
      << c.error().message;
}

TEST(ThawdConfig, OnlyRegularFilesAreRead) {
  // /dev/zero would be read without end and a FIFO would block the open forever: both are
  // refused before any read, whether the path was given or not.
  for (ConfigFile need : {ConfigFile::optional, ConfigFile::required}) {
    auto zero = load_config("/dev/zero", need);
    ASSERT_FALSE(zero);
    EXPECT_NE(zero.error().message.find("/dev/zero: is not a regular file"), std::string::npos)
        << zero.error().message;
  }
  const auto dir =
      std::filesystem::temp_directory_path() / ("thawd-config-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto piped = load_config(fifo, ConfigFile::required);
  ASSERT_FALSE(piped);
  EXPECT_NE(piped.error().message.find("not a regular file"), std::string::npos)
      << piped.error().message;

  // A regular file larger than any configuration is refused too, naming the limit.
  const auto big = dir / "big.toml";
  std::ofstream(big) << std::string(kMaxConfigBytes + 1, '#');
  auto large = load_config(big, ConfigFile::required);
  ASSERT_FALSE(large);
  EXPECT_NE(large.error().message.find("more than a configuration file can be"), std::string::npos)
      << large.error().message;
  std::filesystem::remove_all(dir);
}

TEST(ThawdConfig, ADirectoryIsNotAConfigFile) {
  auto c = load_config(std::filesystem::temp_directory_path());
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("is a directory"), std::string::npos) << c.error().message;
}

TEST(ThawdConfig, RestartNeededListsWhatAReloadCannotChange) {
  ThawdConfig a, b;
  b.registry = "http://x";  // live
  b.connections = 2;        // live
  b.allow_groups = {"ml"};  // live
  EXPECT_TRUE(restart_needed(a, b).empty());
  b.socket_path = "/tmp/other.sock";
  b.pool_share = 0.5;
  b.cache_budget_bytes = 1;
  EXPECT_EQ(restart_needed(a, b),
            (std::vector<std::string>{"store.cache_budget", "gpu.pool_share", "shim.socket"}));
}

TEST(ThawdConfig, CoordinatorKeysAreRead) {
  auto c = parse_config(R"(
[coordinator]
endpoint = "tcp://coord.internal:5570"
server_key = "/etc/thaw/cluster/coordinator.pub"
key = "/etc/thaw/cluster/node.key"
network = "2GB"
pcie = "25GiB"
worker_command = ["/usr/bin/vllm", "serve", "{model}", "--port", "8000"]
worker_preload = "/opt/thaw/libthaw-preload.so"
)",
                        "coordinator.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->coordinator_endpoint, "tcp://coord.internal:5570");
  EXPECT_EQ(c->coordinator_key, "/etc/thaw/cluster/coordinator.pub");
  EXPECT_EQ(c->node_key, "/etc/thaw/cluster/node.key");
  EXPECT_EQ(c->network_bytes_per_s, 2'000'000'000u);
  EXPECT_EQ(c->pcie_bytes_per_s, 25ull << 30);
  EXPECT_EQ(c->worker_command,
            (std::vector<std::string>{"/usr/bin/vllm", "serve", "{model}", "--port", "8000"}));
  EXPECT_EQ(c->worker_preload, "/opt/thaw/libthaw-preload.so");

  auto ipc = parse_config("[coordinator]\nendpoint = \"ipc:///run/thaw/c.sock\"\nnetwork = \"\"\n",
                          "ipc.toml");
  ASSERT_TRUE(ipc) << ipc.error().message;
  EXPECT_EQ(ipc->coordinator_endpoint, "ipc:///run/thaw/c.sock");
  EXPECT_EQ(ipc->network_bytes_per_s, 0u);  // "" = unknown
  EXPECT_TRUE(ipc->worker_command.empty());
}

// "" : workers without the shim (the agent launches each once its stage's fetch is done);
// the default is the packaged shim, and any other value must still be an absolute path.
TEST(ThawdConfig, AnEmptyWorkerPreloadMeansWorkersWithoutTheShim) {
  auto none = parse_config("[coordinator]\nworker_preload = \"\"\n", "noshim.toml");
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_TRUE(none->worker_preload.empty());
  auto unset = parse_config("[coordinator]\n", "default.toml");
  ASSERT_TRUE(unset) << unset.error().message;
  EXPECT_EQ(unset->worker_preload, "/usr/lib/x86_64-linux-gnu/libthaw-preload.so");
  auto relative = parse_config("[coordinator]\nworker_preload = \" \"\n", "blank.toml");
  ASSERT_FALSE(relative);
  EXPECT_NE(relative.error().message.find("absolute"), std::string::npos)
      << relative.error().message;
  auto number = parse_config("[coordinator]\nworker_preload = 0\n", "number.toml");
  ASSERT_FALSE(number);
  EXPECT_NE(number.error().message.find("coordinator.worker_preload"), std::string::npos)
      << number.error().message;
}

TEST(ThawdConfig, CoordinatorErrorsNameTheKey) {
  struct Case {
    const char* text;
    const char* needles[3];
  };
  const Case cases[] = {
      {"[coordinator]\nworker_command = [\"vllm\", \"serve\"]\n",
       {":2:", "coordinator.worker_command", "'vllm' is not an absolute path"}},
      {"[coordinator]\nworker_command = []\n",
       {":2:", "coordinator.worker_command", "non-empty array"}},
      {"[coordinator]\nworker_command = \"/usr/bin/vllm serve\"\n",
       {":2:", "coordinator.worker_command", "non-empty array"}},
      {"[coordinator]\nworker_command = [\"/usr/bin/vllm\", 8000]\n",
       {":2:", "coordinator.worker_command", "string"}},
      {"[coordinator]\nendpoint = \"http://coord:5570\"\n",
       {":2:", "coordinator.endpoint", "not a ZeroMQ address"}},
      {"[coordinator]\nendpoint = \"coord:5570\"\n", {":2:", "coordinator.endpoint", "tcp://"}},
      {"[coordinator]\nendpont = \"tcp://c:5570\"\n",
       {":2:", "coordinator.endpont", "unknown key"}},
      {"[coordinator]\nserver_key = \"coordinator.pub\"\n",
       {":2:", "coordinator.server_key", "absolute"}},
      {"[coordinator]\nkey = \"node.key\"\n", {":2:", "coordinator.key", "absolute"}},
      {"[coordinator]\nnetwork = \"fast\"\n", {":2:", "coordinator.network", "per second"}},
      {"[coordinator]\npcie = -1\n", {":2:", "coordinator.pcie", "per second"}},
      {"[coordinator]\nworker_preload = \"libthaw-preload.so\"\n",
       {":2:", "coordinator.worker_preload", "absolute"}},
  };
  for (const Case& c : cases) {
    auto parsed = parse_config(c.text, "bad.toml");
    ASSERT_FALSE(parsed) << c.text;
    for (const char* needle : c.needles) {
      EXPECT_NE(parsed.error().message.find(needle), std::string::npos)
          << "'" << needle << "' missing from: " << parsed.error().message;
    }
  }
}

TEST(ThawdConfig, RestartNeededListsCoordinatorChanges) {
  ThawdConfig a, b;
  b.coordinator_endpoint = "tcp://c:5570";
  b.coordinator_key = "/etc/thaw/other.pub";
  b.node_key = "/etc/thaw/other.key";
  b.network_bytes_per_s = 1;
  b.pcie_bytes_per_s = 2;
  b.worker_command = {"/usr/bin/engine"};
  b.worker_preload = "/opt/p.so";
  EXPECT_EQ(restart_needed(a, b),
            (std::vector<std::string>{"coordinator.endpoint", "coordinator.server_key",
                                      "coordinator.key", "coordinator.network", "coordinator.pcie",
                                      "coordinator.worker_command", "coordinator.worker_preload"}));
  ThawdConfig only_command;
  only_command.worker_command = {"/usr/bin/engine", "{model}"};
  EXPECT_EQ(restart_needed(a, only_command),
            std::vector<std::string>{"coordinator.worker_command"});
}

}  // namespace
}  // namespace thaw::daemon
