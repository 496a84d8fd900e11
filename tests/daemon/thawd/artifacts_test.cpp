// Operators see the engines' artifacts and the restores (issue 24, part 4), end to end with
// the real thawd: records stored through the shim socket — a graph record, a layout record and a
// KV-cache sizing — are listed by ListArtifacts (to anyone, under the shipped bus policy) and
// thawctl artifacts with their codecs' summaries; a graphs record corrupted in the state
// directory lists as unreadable and thawd goes on serving; the restores' counters an engine
// reports at exit show in the metrics.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/proto/seqpacket.hpp"
#include "sample_records.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using namespace thaw::testing;
using thaw::UniqueFd;
using thaw::proto::Message;
using thaw::proto::MessageType;

constexpr const char* kManager = "/org/thaw/Node1";

class Engine {
 public:
  explicit Engine(const fs::path& socket) {
    auto fd = thaw::proto::connect_seqpacket(socket.string());
    if (!fd) throw std::runtime_error(fd.error());
    fd_ = std::move(*fd);
    EXPECT_EQ(request(MessageType::hello, {{"client", "artifacts-test"}, {"engine", "test"}}),
              "hello_ok");
  }
  // The reply's type ("ok", ...) or the error's name.
  std::string request(MessageType type, nlohmann::json body, const std::vector<int>& fds = {}) {
    Message m;
    m.type = type;
    m.request_id = ++next_id_;
    m.body = std::move(body);
    if (auto sent = thaw::proto::send_message(fd_.get(), m, fds); !sent) return sent.error();
    auto in = thaw::proto::receive_message(fd_.get());
    if (!in) return "receive: " + in.error().message;
    if (in->message.type == MessageType::error) return in->message.body.value("name", "");
    return std::string(thaw::proto::to_string(in->message.type));
  }
  std::string store(const std::string& kind, const std::string& document) {
    UniqueFd fd(::memfd_create("artifact", MFD_CLOEXEC));
    EXPECT_EQ(::write(fd.get(), document.data(), document.size()),
              static_cast<ssize_t>(document.size()));
    return request(
        MessageType::report_artifact,
        {{"kind", kind}, {"identity", SampleIdentity{}.to_json()}, {"bytes", document.size()}},
        {fd.get()});
  }

 private:
  UniqueFd fd_;
  std::uint32_t next_id_ = 0;
};

nlohmann::json by_kind(const nlohmann::json& listed, const std::string& kind) {
  for (const auto& a : listed) {
    if (a["kind"] == kind) return a;
  }
  return nullptr;
}

TEST_F(ThawdFixture, ArtifactsStoredThroughTheShimSocketAreListedWithTheirSummaries) {
  start_thawd(BusPolicy::shipped);
  {
    Engine engine(socket_path());
    EXPECT_EQ(engine.store("graphs", sample_graph_record()), "ok");
    EXPECT_EQ(engine.store("layout", sample_layout_record()), "ok");
    EXPECT_EQ(engine.store("kvcache", sample_kv_record()), "ok");
  }

  auto json = thawctl({"--json", "artifacts"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto listed = nlohmann::json::parse(json.output);
  ASSERT_EQ(listed.size(), 3u) << json.output;
  const nlohmann::json graphs = by_kind(listed, "graphs");
  ASSERT_FALSE(graphs.is_null()) << json.output;
  EXPECT_EQ(graphs["summary"], "2 graphs, 5 nodes, 1 module");
  EXPECT_EQ(graphs["readable"], true);
  EXPECT_EQ(graphs["model"], "gpt-syn");
  EXPECT_EQ(graphs["engine"], SampleIdentity{}.engine);
  EXPECT_EQ(graphs["gpu"], "Thaw Emulated GPU");
  EXPECT_EQ(graphs["driver"], "12040");
  EXPECT_EQ(graphs["owner"], ::getuid());
  EXPECT_EQ(graphs["bytes"], sample_graph_record().size());
  EXPECT_GT(graphs["modified_usec"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(by_kind(listed, "layout")["summary"], "3 allocations, 3.0 MiB of weights in 2 copies");
  EXPECT_EQ(by_kind(listed, "kvcache")["summary"], "KV cache of 32.0 MiB in 512 blocks");
  EXPECT_EQ(nlohmann::json::parse(thawctl({"--json", "artifacts", "gpt-syn"}).output).size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(thawctl({"--json", "artifacts", "other"}).output).size(), 0u);

  auto table = thawctl({"artifacts", "gpt-syn"});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("2 graphs, 5 nodes, 1 module"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("refengine"), std::string::npos) << table.output;

  // Reading is open to everyone under the shipped policy; changing things still is not.
  auto as_nobody = busctl_as_nobody(
      bus_->address(),
      {"call", "org.thaw.Node1", kManager, "org.thaw.Node1.Manager", "ListArtifacts", "s", ""});
  EXPECT_EQ(as_nobody.exit_code, 0) << as_nobody.output;
  EXPECT_NE(as_nobody.output.find("2 graphs, 5 nodes, 1 module"), std::string::npos)
      << as_nobody.output;
  auto denied = busctl_as_nobody(bus_->address(), {"call", "org.thaw.Node1", kManager,
                                                   "org.thaw.Node1.Manager", "Fetch", "s", "x"});
  EXPECT_NE(denied.exit_code, 0) << denied.output;
  // The interface is the shipped XML's.
  auto intro =
      busctl(bus_->address(), {"introspect", "--xml-interface", "org.thaw.Node1", kManager});
  EXPECT_EQ(interface_block(intro.output, "org.thaw.Node1.Manager"),
            interface_block(slurp(THAW_SOURCE_DIR "/packaging/org.thaw.Node1.Manager.xml"),
                            "org.thaw.Node1.Manager"));

  // A graphs record corrupted on disk: listed as unreadable, with the codec's reason.
  fs::path graphs_file;
  for (const auto& e : fs::directory_iterator(dir_.path() / "state" / "artifacts")) {
    if (e.path().filename().string().starts_with("graphs-")) graphs_file = e.path();
  }
  ASSERT_FALSE(graphs_file.empty());
  const std::string good = sample_graph_record();
  std::ofstream(graphs_file, std::ios::trunc) << good.substr(0, good.size() / 2);
  json = thawctl({"--json", "artifacts"});
  ASSERT_EQ(json.exit_code, 0) << json.output << log();
  listed = nlohmann::json::parse(json.output);
  ASSERT_EQ(listed.size(), 3u) << json.output;
  EXPECT_EQ(by_kind(listed, "graphs")["readable"], false) << json.output;
  EXPECT_NE(by_kind(listed, "graphs")["summary"].get<std::string>().find("not JSON"),
            std::string::npos)
      << json.output;
  EXPECT_EQ(by_kind(listed, "layout")["readable"], true);
  table = thawctl({"artifacts"});
  EXPECT_NE(table.output.find("unreadable: "), std::string::npos) << table.output;
  // thawd goes on: it answers, and an engine's next record replaces the corrupt one.
  ASSERT_EQ(::kill(thawd_pid(), 0), 0) << log();
  EXPECT_EQ(get_property(bus_->address(), kManager, "org.thaw.Node1.Manager", "State"),
            "s \"running\"");
  {
    Engine engine(socket_path());
    EXPECT_EQ(engine.store("graphs", sample_graph_record()), "ok");
  }
  listed = nlohmann::json::parse(thawctl({"--json", "artifacts"}).output);
  EXPECT_EQ(by_kind(listed, "graphs")["readable"], true) << listed.dump();
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ThawdFixture, RestoreCountersEnginesReportShowInTheMetrics) {
  start_thawd(BusPolicy::open);
  for (int i = 0; i < 2; ++i) {
    Engine engine(socket_path());
    EXPECT_EQ(engine.request(MessageType::report_counters, {{"counters",
                                                             {{"calls_intercepted", 10},
                                                              {"deterministic_allocations", 4},
                                                              {"layout_divergences", 0},
                                                              {"files_streamed", 1},
                                                              {"reads_waited", 0},
                                                              {"bytes_streamed", 0},
                                                              {"graph_records_stored", 1},
                                                              {"graphs_restored", 3},
                                                              {"graph_restore_fallbacks", 1},
                                                              {"kv_restores", 1},
                                                              {"kv_restore_fallbacks", i}}}}),
              "ok");
  }
  // A report of protocol 4's shape (without the restores' counters) is malformed now.
  {
    Engine old(socket_path());
    EXPECT_NE(old.request(MessageType::report_counters, {{"counters",
                                                          {{"calls_intercepted", 1},
                                                           {"deterministic_allocations", 0},
                                                           {"layout_divergences", 0},
                                                           {"files_streamed", 0},
                                                           {"reads_waited", 0},
                                                           {"bytes_streamed", 0}}}}),
              "ok");
  }
  const auto metrics = run({"/usr/bin/curl", "-sf", metrics_url()});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.output;
  for (const char* line :
       {"thaw_engine_reports_total 2\n", "thaw_engine_graph_records_stored_total 2\n",
        "thaw_engine_graphs_restored_total 6\n", "thaw_engine_graph_restore_fallbacks_total 2\n",
        "thaw_engine_kv_restores_total 2\n", "thaw_engine_kv_restore_fallbacks_total 1\n",
        "# TYPE thaw_engine_graphs_restored counter\n"}) {
    EXPECT_NE(metrics.output.find(line), std::string::npos) << line << metrics.output;
  }
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
