// thawd end to end, with real components only: a private dbus-daemon running the system
// bus's default policy plus the shipped packaging/org.thaw.Node1.conf, a loopback nginx
// serving a synthetic GPT-2 (thaw-genmodel) with a throttled location, the CUDA driver
// emulator, and the real thawd binary, driven by busctl, dbus-send, setpriv and thawctl.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "fetch_test_support.hpp"
#include "nginx_server.hpp"
#include "temp_dir.hpp"
#include "thawd_fixture.hpp"
#include "thawd_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace thaw::testing;
using thaw::store::testing::model_files;
using thaw::store::testing::read_file;

constexpr const char* kManager = "/org/thaw/Node1";
constexpr const char* kModelPath = "/org/thaw/Node1/model/gpt_2dsyn";  // "gpt-syn" escaped

TEST_F(ThawdFixture, BusctlFetchPrewarmActivateEvictUnderTheShippedPolicy) {
  start_registry();
  start_thawd(BusPolicy::shipped, "8MB");

  // Introspection: the Manager with the ObjectManager at the root, and the shipped XML.
  auto intro =
      busctl(bus_->address(), {"introspect", "--xml-interface", "org.thaw.Node1", kManager});
  ASSERT_EQ(intro.exit_code, 0) << intro.output;
  EXPECT_NE(intro.output.find("org.freedesktop.DBus.ObjectManager"), std::string::npos);
  EXPECT_EQ(interface_block(intro.output, "org.thaw.Node1.Manager"),
            interface_block(slurp(THAW_SOURCE_DIR "/packaging/org.thaw.Node1.Manager.xml"),
                            "org.thaw.Node1.Manager"));
  EXPECT_EQ(get_property(bus_->address(), kManager, "org.thaw.Node1.Manager", "GpuCount"), "u 1");
  EXPECT_EQ(
      get_property(bus_->address(), "/org/thaw/Node1/gpu/0", "org.thaw.Node1.Gpu", "ActiveSlot"),
      "s \"\"");

  // Fetch, watching the model object's PropertiesChanged signals with busctl monitor.
  const fs::path monitor_out = dir_.path() / "monitor.json";
  const pid_t monitor = spawn({"/usr/bin/busctl", "--address=" + bus_->address(), "monitor",
                               "--json=short", "org.thaw.Node1"},
                              {}, dir_.path() / "monitor.err", monitor_out);
  ::usleep(300'000);  // the monitor is registered with the bus
  auto fetch = busctl(bus_->address(), {"call", "org.thaw.Node1", kManager,
                                        "org.thaw.Node1.Manager", "Fetch", "s", "gpt-syn"});
  ASSERT_EQ(fetch.exit_code, 0) << fetch.output;
  EXPECT_EQ(fetch.output, std::string("o \"") + kModelPath + "\"\n");
  ASSERT_TRUE(eventually(
      [&] {
        return get_property(bus_->address(), kModelPath, "org.thaw.Node1.Model", "State") ==
               "s \"complete\"";
      },
      60s))
      << get_property(bus_->address(), kModelPath, "org.thaw.Node1.Model", "Error");
  ::usleep(600'000);  // the last tick's signal
  ::kill(monitor, SIGINT);
  wait_exit(monitor);
  std::vector<std::uint64_t> progress;
  bool saw_complete = false;
  std::ifstream lines(monitor_out);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("member", "") != "PropertiesChanged" ||
        j.value("path", "") != kModelPath) {
      continue;
    }
    const auto& changed = j["payload"]["data"][1];
    if (changed.contains("FetchedBytes")) {
      progress.push_back(changed["FetchedBytes"]["data"].get<std::uint64_t>());
    }
    if (changed.contains("State") && changed["State"]["data"] == "complete") saw_complete = true;
  }
  ASSERT_GE(progress.size(), 3u) << "expected several progress signals: " << slurp(monitor_out);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(progress.back(), model_bytes());
  EXPECT_TRUE(saw_complete);

  // Prewarm onto GPU 0, then activate, through busctl; the slot is an object of its own.
  auto prewarm =
      busctl(bus_->address(), {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager",
                               "Prewarm", "si", "gpt-syn", "0"});
  ASSERT_EQ(prewarm.exit_code, 0) << prewarm.output;
  EXPECT_EQ(prewarm.output, "o \"/org/thaw/Node1/slot/g0s0\"\n");
  const std::string slot = "/org/thaw/Node1/slot/g0s0";
  ASSERT_TRUE(eventually([&] {
    return get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "State") == "s \"prewarmed\"";
  })) << get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "Error");
  EXPECT_EQ(get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "ResidentBytes"),
            get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "TotalBytes"));
  EXPECT_EQ(get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "Model"), "s \"gpt-syn\"");
  // Each object type's interface is exactly the shipped XML.
  for (const auto& [path, name] : std::vector<std::pair<std::string, std::string>>{
           {"/org/thaw/Node1/gpu/0", "Gpu"}, {slot, "Slot"}, {kModelPath, "Model"}}) {
    const std::string interface = "org.thaw.Node1." + name;
    auto xml = busctl(bus_->address(), {"introspect", "--xml-interface", "org.thaw.Node1", path});
    EXPECT_FALSE(interface_block(xml.output, interface).empty()) << xml.output;
    EXPECT_EQ(
        interface_block(xml.output, interface),
        interface_block(slurp(std::string(THAW_SOURCE_DIR "/packaging/") + interface + ".xml"),
                        interface))
        << "packaging/" << interface << ".xml differs from what thawd exports";
  }
  auto tree = busctl(bus_->address(), {"tree", "org.thaw.Node1"});
  EXPECT_NE(tree.output.find("/org/thaw/Node1/slot/g0s0"), std::string::npos) << tree.output;
  auto managed =
      busctl(bus_->address(), {"call", "org.thaw.Node1", kManager,
                               "org.freedesktop.DBus.ObjectManager", "GetManagedObjects"});
  EXPECT_NE(managed.output.find("org.thaw.Node1.Slot"), std::string::npos) << managed.output;

  auto activate =
      busctl(bus_->address(), {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager",
                               "Activate", "st", "g0s0", "0"});
  ASSERT_EQ(activate.exit_code, 0) << activate.output;
  EXPECT_EQ(get_property(bus_->address(), slot, "org.thaw.Node1.Slot", "State"), "s \"active\"");
  EXPECT_EQ(
      get_property(bus_->address(), "/org/thaw/Node1/gpu/0", "org.thaw.Node1.Gpu", "ActiveSlot"),
      "s \"g0s0\"");

  // An active slot cannot be evicted; the error is named and says what to do.
  auto busy = dbus_send(bus_->address(), {kManager, "org.thaw.Node1.Manager.Evict", "string:g0s0"});
  EXPECT_NE(busy.exit_code, 0);
  EXPECT_NE(busy.output.find("org.thaw.Error.SlotBusy"), std::string::npos) << busy.output;
  EXPECT_NE(busy.output.find("thawctl deactivate g0s0"), std::string::npos) << busy.output;

  // An unprivileged user reads everything but is refused Prewarm by the bus policy.
  auto read = busctl_as_nobody(
      bus_->address(), {"get-property", "org.thaw.Node1", slot, "org.thaw.Node1.Slot", "State"});
  EXPECT_EQ(read.exit_code, 0) << read.output;
  EXPECT_EQ(read.output, "s \"active\"\n");
  auto list = busctl_as_nobody(
      bus_->address(), {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager", "ListSlots"});
  EXPECT_EQ(list.exit_code, 0) << list.output;
  auto denied = busctl_as_nobody(
      bus_->address(), {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager", "Prewarm",
                        "si", "gpt-syn", "0"});
  EXPECT_NE(denied.exit_code, 0);
  EXPECT_NE(denied.output.find("Access denied"), std::string::npos) << denied.output;
  // Refused by the bus itself (the shipped policy), before thawd saw the call.
  auto by_bus = run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                     "/usr/bin/dbus-send", "--bus=" + bus_->address(), "--print-reply",
                     "--dest=org.thaw.Node1", kManager, "org.thaw.Node1.Manager.Prewarm",
                     "string:gpt-syn", "int32:0"});
  EXPECT_NE(by_bus.output.find("Rejected send message"), std::string::npos) << by_bus.output;

  // Deactivate, evict: the slot object goes away and the GPU's pages are all free again.
  ASSERT_EQ(busctl(bus_->address(), {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager",
                                     "Deactivate", "s", "g0s0"})
                .exit_code,
            0);
  ASSERT_TRUE(eventually([&] {
    return busctl(bus_->address(), {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager",
                                    "Evict", "s", "g0s0"})
               .exit_code == 0;
  }));
  EXPECT_TRUE(eventually([&] {
    return busctl(bus_->address(), {"tree", "org.thaw.Node1"}).output.find("g0s0") ==
           std::string::npos;
  }));
  EXPECT_EQ(
      get_property(bus_->address(), "/org/thaw/Node1/gpu/0", "org.thaw.Node1.Gpu", "FreeBytes"),
      get_property(bus_->address(), "/org/thaw/Node1/gpu/0", "org.thaw.Node1.Gpu", "PoolBytes"));

  // Metrics on loopback, OpenMetrics text.
  auto metrics = run({"/usr/bin/curl", "-sf", metrics_url()});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.output;
  EXPECT_NE(metrics.output.find("thaw_activations_total 1\n"), std::string::npos) << metrics.output;
  EXPECT_NE(metrics.output.find("thaw_fetches_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.output.find("thaw_fetched_bytes_total{class=\"critical\"} " +
                                std::to_string(model_bytes()) + "\n"),
            std::string::npos)
      << metrics.output;
  EXPECT_TRUE(metrics.output.ends_with("# EOF\n"));
  // The fixture turns shaping off ([network] shaping = false): said on the bus and in metrics.
  EXPECT_NE(metrics.output.find("thaw_net_shaping_enabled 0\n"), std::string::npos);
  EXPECT_NE(metrics.output.find(
                "thaw_net_class_bytes_total{class=\"critical_fetch\",direction=\"ingress\"} 0\n"),
            std::string::npos);
  auto net = thawctl({"--json", "net"});
  ASSERT_EQ(net.exit_code, 0) << net.output;
  const auto shaping = nlohmann::json::parse(net.output);
  EXPECT_EQ(shaping["enabled"], false);
  EXPECT_EQ(shaping["detail"], "traffic shaping off: network.shaping = false");
  EXPECT_EQ(shaping["rates_from"], "config");
  ASSERT_EQ(shaping["classes"].size(), 4u);
  EXPECT_EQ(shaping["classes"][1]["class"], "critical_fetch");
  EXPECT_EQ(shaping["classes"][1]["ingress"]["bytes"], 0);
  auto table = thawctl({"net"});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("shaping:  off"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("background_fetch"), std::string::npos) << table.output;

  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, BadRequestsGetNamedErrorsThatSayWhatToDo) {
  start_registry();
  start_thawd(BusPolicy::shipped);
  struct Case {
    std::vector<std::string> call;
    const char* name;
    const char* hint;
  };
  for (const Case& c : std::vector<Case>{
           {{"org.thaw.Node1.Manager.Activate", "string:g9s9", "uint64:0"},
            "org.thaw.Error.UnknownSlot",
            "thawctl slots"},
           {{"org.thaw.Node1.Manager.Prewarm", "string:gpt-syn", "int32:7"},
            "org.thaw.Error.UnknownGpu",
            "this node has 1"},
           {{"org.thaw.Node1.Manager.Fetch", "string:"},
            "org.thaw.Error.InvalidArgument",
            "name it as on the registry"},
           {{"org.thaw.Node1.Manager.Fetch", "string:../etc"},
            "org.thaw.Error.InvalidArgument",
            ""},
           {{"org.thaw.Node1.Manager.Evict", "string:nope"}, "org.thaw.Error.UnknownSlot", ""},
           {{"org.thaw.Node1.Manager.Fetch", "int32:3"},
            "org.freedesktop.DBus.Error.InvalidArgs",
            ""},
       }) {
    std::vector<std::string> args = {kManager};
    args.insert(args.end(), c.call.begin(), c.call.end());
    auto r = dbus_send(bus_->address(), args);
    EXPECT_NE(r.exit_code, 0) << c.call[0];
    EXPECT_NE(r.output.find(c.name), std::string::npos) << c.call[0] << ": " << r.output;
    EXPECT_NE(r.output.find(c.hint), std::string::npos) << c.call[0] << ": " << r.output;
  }
  // A model the registry does not have: the fetch fails, visibly, and thawctl exits 3.
  auto missing = run({THAWCTL_PATH, "--bus=" + bus_->address(), "fetch", "no-such-model"});
  EXPECT_EQ(missing.exit_code, 3) << missing.output;
  EXPECT_NE(missing.output.find("no-such-model"), std::string::npos) << missing.output;
  EXPECT_EQ(get_property(bus_->address(), "/org/thaw/Node1/model/no_2dsuch_2dmodel",
                         "org.thaw.Node1.Model", "State"),
            "s \"failed\"");
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, ThawdChecksCallersItselfWhenTheBusLetsEveryoneThrough) {
  start_registry();
  start_thawd(BusPolicy::open);
  // busctl shows only "Access denied"; dbus-send prints the error's name and message.
  auto denied =
      run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
           "/usr/bin/dbus-send", "--bus=" + bus_->address(), "--print-reply",
           "--dest=org.thaw.Node1", kManager, "org.thaw.Node1.Manager.Fetch", "string:gpt-syn"});
  EXPECT_NE(denied.exit_code, 0);
  EXPECT_NE(denied.output.find("org.freedesktop.DBus.Error.AccessDenied"), std::string::npos);
  EXPECT_NE(denied.output.find("Fetch needs root or group"), std::string::npos) << denied.output;
  EXPECT_NE(denied.output.find("uid 65534"), std::string::npos) << denied.output;
  // Reading stays open.
  auto read = busctl_as_nobody(bus_->address(), {"get-property", "org.thaw.Node1", kManager,
                                                 "org.thaw.Node1.Manager", "State"});
  EXPECT_EQ(read.output, "s \"running\"\n");
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, KillNineMidFetchThenRestartResumesAndNeverShowsPartialAsComplete) {
  start_registry();
  start_thawd(BusPolicy::open, "2MB");
  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0);
  std::uint64_t before_kill = 0;
  ASSERT_TRUE(eventually([&] {
    auto text = get_property(bus_->address(), kModelPath, "org.thaw.Node1.Model", "FetchedBytes");
    before_kill = text.size() > 2 ? std::stoull(text.substr(2)) : 0;
    return before_kill > model_bytes() / 5;
  }));
  ASSERT_LT(before_kill, model_bytes());
  kill_thawd();

  start_thawd(BusPolicy::open);
  auto models = thawctl({"--json", "models"});
  auto listed = nlohmann::json::parse(models.output);
  ASSERT_EQ(listed.size(), 1u) << models.output;
  EXPECT_EQ(listed[0]["key"], "gpt-syn");
  EXPECT_EQ(listed[0]["state"], "partial");  // re-indexed: partial, not complete
  EXPECT_GE(listed[0]["fetched_bytes"].get<std::uint64_t>(), before_kill / 2);
  EXPECT_LT(listed[0]["fetched_bytes"].get<std::uint64_t>(), model_bytes());
  auto wait_timeout = thawctl({"wait", "gpt-syn", "--timeout", "0.3"});
  EXPECT_EQ(wait_timeout.exit_code, 3)
      << "a partial model with no fetch is settled: " << wait_timeout.output;

  const std::size_t requests_before = registry_->server().access_log().size();
  auto resumed = thawctl({"fetch", "gpt-syn"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output << log();
  // Every cached byte equals the registry's, and the resumed run skipped what was verified.
  for (const std::string& file : model_files(registry_->model_dir())) {
    EXPECT_EQ(read_file(dir_.path() / "cache" / "gpt-syn" / file),
              read_file(registry_->model_dir() / file))
        << file;
  }
  std::uint64_t resumed_bytes = 0;
  const auto access = registry_->server().access_log();
  for (std::size_t i = requests_before; i < access.size(); ++i) {
    resumed_bytes += std::stoull(access[i].substr(access[i].rfind(' ') + 1));
  }
  EXPECT_LT(resumed_bytes, model_bytes() - before_kill / 2);
  // Every --json output is snake_case, fetch's and wait's too (they printed the bus's names).
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"--json", "fetch", "gpt-syn"},
        std::vector<std::string>{"--json", "wait", "gpt-syn"}}) {
    auto r = thawctl(command);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto doc = nlohmann::json::parse(r.output);
    EXPECT_EQ(doc["key"], "gpt-syn") << r.output;
    EXPECT_EQ(doc["state"], "complete") << r.output;
    EXPECT_EQ(doc["integrity"], "verified") << r.output;
    EXPECT_EQ(doc["fetched_bytes"], model_bytes()) << r.output;
    EXPECT_FALSE(doc.contains("State")) << r.output;
  }
  auto listed_again = nlohmann::json::parse(thawctl({"--json", "models"}).output);
  EXPECT_EQ(listed_again[0]["integrity"], "verified");
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
