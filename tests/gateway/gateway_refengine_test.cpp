// thaw-gateway in front of real reference-engine workers on the emulator: the thaw-gateway
// program with --route gives the same tokens as the worker asked directly, streaming and not;
// a stream is relayed token by token (its first event long before its last token), goes to
// another worker when its worker fails before the first event, and ends with an error event
// (no [DONE]) when its worker dies mid-stream;
// a request held during a "cold start" (the worker's process started on the gateway's ask,
// routed once its /health answers) is answered with the same tokens; the program's --help and
// its refusals of bad flags.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "child_process.hpp"
#include "gateway/gateway_server.hpp"
#include "temp_dir.hpp"

namespace thaw::gateway {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using testing::ChildProcess;
using testing::until;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> engine_env() {
  const std::string emu_dir = std::filesystem::path(THAW_EMU_LIBCUDA).parent_path().string();
  return {std::string("REFENGINE_LIBCUDA=") + THAW_EMU_LIBCUDA, "LD_LIBRARY_PATH=" + emu_dir,
          std::string("THAW_EMU_KERNELS=") + THAW_TWIN_LIB, "THAW_EMU_DEVICE_MEMORY=6G"};
}

std::unique_ptr<ChildProcess> start_worker(int port, const std::filesystem::path& log,
                                           const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{
      REFENGINE_BIN,        "serve",           "--model", TINY_GPT2_DIR,    "--port",
      std::to_string(port), "--max-model-len", "64",      "--max-num-seqs", "4"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<ChildProcess>(argv, log, engine_env());
}

bool healthy(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(1, 0);
  auto r = c.Get("/health");
  return r && r->status == 200;
}

json post(int port, const json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return {{"transport_error", httplib::to_string(r.error())}};
  json out = json::parse(r->body, nullptr, false);
  if (out.is_discarded()) return {{"status", r->status}, {"raw", r->body}};
  out["http_status"] = r->status;
  return out;
}

// The token ids of an SSE answer's events, in order.
std::vector<int> streamed_tokens(const std::string& sse) {
  std::vector<int> tokens;
  std::size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const auto end = sse.find("\n\n", at);
    const std::string data = sse.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    json event = json::parse(data);
    for (int t : event["choices"][0]["token_ids"]) tokens.push_back(t);
  }
  return tokens;
}

TEST(GatewayRefengine, SameTokensThroughTheGatewayAsDirectStreamingAndNot) {
  thaw::testing::TempDir dir("thaw-gateway-ref");
  const int worker_port = free_port();
  auto worker = start_worker(worker_port, dir.path() / "worker.log");
  ASSERT_TRUE(until([&] { return healthy(worker_port); }, 60s)) << worker->log();
  const int gateway_port = free_port();
  ChildProcess gateway({THAW_GATEWAY_BIN, "--listen", "127.0.0.1:" + std::to_string(gateway_port),
                        "--route", "tiny=http://127.0.0.1:" + std::to_string(worker_port)},
                       dir.path() / "gateway.log");
  ASSERT_TRUE(until([&] { return healthy(gateway_port); }, 10s)) << gateway.log();

  for (const json& prompt : {json({1, 2, 3}), json(" lowest")}) {
    json body{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"ignore_eos", true}};
    const json direct = post(worker_port, body);
    const json via = post(gateway_port, body);
    ASSERT_TRUE(direct.contains("choices")) << direct.dump();
    ASSERT_TRUE(via.contains("choices")) << via.dump() << gateway.log();
    EXPECT_EQ(via["choices"][0]["token_ids"], direct["choices"][0]["token_ids"]);
    EXPECT_EQ(via["choices"][0]["text"], direct["choices"][0]["text"]);
    EXPECT_EQ(via["choices"][0]["token_ids"].size(), 8u);

    body["stream"] = true;
    httplib::Client c("127.0.0.1", gateway_port);
    c.set_read_timeout(120, 0);
    auto streamed = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(streamed);
    EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
    EXPECT_EQ(json(streamed_tokens(streamed->body)), direct["choices"][0]["token_ids"])
        << streamed->body;
    std::string text;
    for (std::size_t at = 0; (at = streamed->body.find("data: {", at)) != std::string::npos;) {
      const auto end = streamed->body.find("\n\n", at);
      text += json::parse(streamed->body.substr(at + 6, end - at - 6))["choices"][0]["text"]
                  .get<std::string>();
      at = end;
    }
    EXPECT_EQ(text, direct["choices"][0]["text"]);
    EXPECT_TRUE(streamed->body.ends_with("data: [DONE]\n\n"));
  }
  // The gateway's own answers: models, and an unknown one.
  httplib::Client c("127.0.0.1", gateway_port);
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"][0]["id"], "tiny");
  EXPECT_EQ(post(gateway_port, {{"model", "other"}, {"prompt", {1}}})["http_status"], 404);
  EXPECT_EQ(WEXITSTATUS(gateway.stop()), 0) << gateway.log();
}

TEST(GatewayRefengine, RequestHeldDuringAColdStartIsAnsweredByTheNewWorker) {
  thaw::testing::TempDir dir("thaw-gateway-ref");
  const int worker_port = free_port();
  std::unique_ptr<ChildProcess> worker;
  std::thread starter;
  std::atomic<int> asks{0};
  // The control plane of this test: a cold start is this process starting the worker, and
  // the route push comes when its /health answers (the coordinator's job in a cluster).
  struct ColdStarter final : ControlPlane {
    std::function<void(const std::string&)> fn;
    void request_cold_start(const std::string& m) override { fn(m); }
    void report_load(const std::vector<ModelLoadSample>&) override {}
  } control;
  RouterOptions ro;
  ro.hold_deadline = 90s;
  Router router(ro, [&](const std::string& m) { control.request_cold_start(m); });
  control.fn = [&](const std::string& model) {
    ++asks;
    router.replace({{model, {{"", WorkerState::cold_starting}}}});
    worker = start_worker(worker_port, dir.path() / "worker.log");
    starter = std::thread([&, model] {
      if (until([&] { return healthy(worker_port); }, 60s)) {
        router.replace({{model, {{"http://127.0.0.1:" + std::to_string(worker_port)}}}});
      }
    });
  };
  router.replace({{"tiny", {}}});
  GatewayOptions go;
  go.port = 0;
  auto server = GatewayServer::start(go, router, control);
  ASSERT_TRUE(server) << server.error();
  std::thread serving([&] { (*server)->run(); });
  struct Cleanup {
    std::function<void()> fn;
    ~Cleanup() { fn(); }
  } cleanup{[&] {
    (*server)->stop();
    if (serving.joinable()) serving.join();
    if (starter.joinable()) starter.join();
  }};

  json body{{"model", "tiny"}, {"prompt", {4, 5}}, {"max_tokens", 6}, {"ignore_eos", true}};
  const json first = post((*server)->port(), body);  // held until the worker is up
  EXPECT_EQ(first.value("http_status", 0), 200) << first.dump();
  EXPECT_EQ(asks.load(), 1);
  ASSERT_TRUE(worker);
  const json direct = post(worker_port, body);
  EXPECT_EQ(first["choices"][0]["token_ids"], direct["choices"][0]["token_ids"]);
  EXPECT_EQ(first["choices"][0]["token_ids"].size(), 6u);
}

// A streamed answer read as it arrives: each event's data (but [DONE]) with its arrival time.
struct Stream {
  std::vector<json> events;
  std::vector<double> at_ms;
  bool done = false;
  double total_ms = 0;
  std::vector<int> tokens;
  int token_events = 0;
};

Stream read_stream(int port, json body, const std::function<void(const Stream&)>& on_event = {}) {
  body["stream"] = true;
  Stream s;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer;
  const auto start = std::chrono::steady_clock::now();
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    buffer.append(data, n);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string payload = buffer.substr(6, end - 6);  // after "data: "
      buffer.erase(0, end + 2);
      if (payload == "[DONE]") {
        s.done = true;
        continue;
      }
      s.at_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      s.events.push_back(json::parse(payload));
      const json& e = s.events.back();
      if (e.contains("choices") && !e["choices"][0]["token_ids"].empty()) {
        ++s.token_events;
        for (int t : e["choices"][0]["token_ids"]) s.tokens.push_back(t);
      }
      if (on_event) on_event(s);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error;
  c.send(req, res, error);
  s.total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return s;
}

// A worker that crashes after taking a request: reads it and closes the connection.
class CrashingWorker {
 public:
  CrashingWorker() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t n = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n);
    port = ntohs(a.sin_port);
    ::listen(fd_, 16);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        (void)::recv(c, buf, sizeof buf, 0);
        ++taken;
        ::close(c);
      }
    });
  }
  ~CrashingWorker() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port = 0;
  std::atomic<int> taken{0};

 private:
  int fd_ = -1;
  std::thread thread_;
};

std::string url_of(int port) {
  return "http://127.0.0.1:" + std::to_string(port);
}

TEST(GatewayRefengine, AStreamIsRelayedTokenByTokenAsTheWorkerDecodes) {
  constexpr int kTokens = 32, kStepMs = 40;
  thaw::testing::TempDir dir("thaw-gateway-ref");
  const int worker_port = free_port();
  auto worker = start_worker(worker_port, dir.path() / "worker.log",
                             {"--step-delay-ms", std::to_string(kStepMs)});
  ASSERT_TRUE(until([&] { return healthy(worker_port); }, 60s)) << worker->log();
  const int gateway_port = free_port();
  ChildProcess gateway({THAW_GATEWAY_BIN, "--listen", "127.0.0.1:" + std::to_string(gateway_port),
                        "--route", "tiny=" + url_of(worker_port)},
                       dir.path() / "gateway.log");
  ASSERT_TRUE(until([&] { return healthy(gateway_port); }, 10s)) << gateway.log();
  const json body{
      {"model", "tiny"}, {"prompt", " lowest"}, {"max_tokens", kTokens}, {"ignore_eos", true}};
  const json direct = post(worker_port, body);
  ASSERT_TRUE(direct.contains("choices")) << direct.dump();
  const Stream s = read_stream(gateway_port, body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(json(s.tokens), direct["choices"][0]["token_ids"]);
  ASSERT_EQ(s.token_events, kTokens);
  const double first = s.at_ms.front(), last_token = s.at_ms[kTokens - 1];
  std::printf(
      "through the gateway: %d tokens, %d ms steps: first chunk %.0f ms, last token %.0f "
      "ms, total %.0f ms\n",
      kTokens, kStepMs, first, last_token, s.total_ms);
  EXPECT_LT(first, s.total_ms / 4);
  EXPECT_GT(last_token - first, 0.7 * (kTokens - 1) * kStepMs);
}

TEST(GatewayRefengine, AStreamWhoseWorkerFailsBeforeItsFirstEventGoesToAnotherWorker) {
  thaw::testing::TempDir dir("thaw-gateway-ref");
  CrashingWorker crashing;
  const int worker_port = free_port();
  auto worker = start_worker(worker_port, dir.path() / "worker.log");
  ASSERT_TRUE(until([&] { return healthy(worker_port); }, 60s)) << worker->log();
  const int gateway_port = free_port();
  ChildProcess gateway(
      {THAW_GATEWAY_BIN, "--listen", "127.0.0.1:" + std::to_string(gateway_port), "--route",
       "tiny=" + url_of(crashing.port), "--route", "tiny=" + url_of(worker_port)},
      dir.path() / "gateway.log");
  ASSERT_TRUE(until([&] { return healthy(gateway_port); }, 10s)) << gateway.log();
  const json body{
      {"model", "tiny"}, {"prompt", {1, 2, 3}}, {"max_tokens", 6}, {"ignore_eos", true}};
  const json direct = post(worker_port, body);
  ASSERT_TRUE(direct.contains("choices")) << direct.dump();
  // Ties take turns: one of the two streams goes to the crashing worker first.
  for (int i = 0; i < 2; ++i) {
    const Stream s = read_stream(gateway_port, body);
    EXPECT_TRUE(s.done) << i;
    EXPECT_EQ(json(s.tokens), direct["choices"][0]["token_ids"]) << i;
    for (const json& e : s.events) EXPECT_FALSE(e.contains("error")) << e.dump();
  }
  EXPECT_EQ(crashing.taken.load(), 1);
}

TEST(GatewayRefengine, AWorkerDyingMidStreamEndsTheStreamWithAnErrorEvent) {
  thaw::testing::TempDir dir("thaw-gateway-ref");
  const int worker_port = free_port();
  auto worker = start_worker(worker_port, dir.path() / "worker.log", {"--step-delay-ms", "50"});
  ASSERT_TRUE(until([&] { return healthy(worker_port); }, 60s)) << worker->log();
  const int gateway_port = free_port();
  ChildProcess gateway({THAW_GATEWAY_BIN, "--listen", "127.0.0.1:" + std::to_string(gateway_port),
                        "--route", "tiny=" + url_of(worker_port)},
                       dir.path() / "gateway.log");
  ASSERT_TRUE(until([&] { return healthy(gateway_port); }, 10s)) << gateway.log();
  const json body{
      {"model", "tiny"}, {"prompt", {1, 2, 3}}, {"max_tokens", 60}, {"ignore_eos", true}};
  const Stream s = read_stream(gateway_port, body, [&](const Stream& so_far) {
    if (so_far.token_events == 3) ::kill(worker->pid(), SIGKILL);
  });
  EXPECT_FALSE(s.done) << "a cut stream must not end with [DONE]";
  ASSERT_GE(s.token_events, 3);
  EXPECT_LT(s.token_events, 60);
  ASSERT_FALSE(s.events.empty());
  const json& last = s.events.back();
  ASSERT_TRUE(last.contains("error")) << last.dump();
  EXPECT_EQ(last["error"]["code"], "upstream_interrupted");
  EXPECT_NE(last["error"]["message"].get<std::string>().find("mid-stream"), std::string::npos);
}

TEST(GatewayProgram, HelpAndBadFlags) {
  thaw::testing::TempDir dir("thaw-gateway-cli");
  ChildProcess help({THAW_GATEWAY_BIN, "--help"}, dir.path() / "help.log");
  ASSERT_TRUE(until([&] { return !help.running(); }, 5s));
  EXPECT_EQ(WEXITSTATUS(help.stop()), 0);
  const std::string text = help.log();
  EXPECT_NE(text.find("--route"), std::string::npos) << text;
  EXPECT_NE(text.find("--hold-deadline"), std::string::npos) << text;
  EXPECT_NE(text.find("Retry-After"), std::string::npos) << text;

  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {{{}, "give either --coordinator"},
               {{"--route", "m=http://h"}, "port"},
               {{"--route", "m=http://h:1", "--coordinator", "ipc:///x"}, "either"},
               {{"--route", "m=http://h:1", "--hold-deadline", "soon"}, "--hold-deadline"},
               {{"--route", "m=http://h:1", "--max-body", "4MB"}, "--max-body"},
               {{"--coordinator", "udp://x"}, "tcp://"}};
  for (const Case& c : cases) {
    std::vector<std::string> argv{THAW_GATEWAY_BIN};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    ChildProcess p(argv, dir.path() / "bad.log");
    ASSERT_TRUE(until([&] { return !p.running(); }, 5s)) << c.says;
    EXPECT_EQ(WEXITSTATUS(p.stop()), 2) << c.says;
    EXPECT_NE(p.log().find(c.says), std::string::npos) << p.log();
  }
}

}  // namespace
}  // namespace thaw::gateway
