// GatewayServer in-process, over real HTTP: fake workers (cpp-httplib servers in this process)
// behind it, a fake control plane. Proxying and streaming, holding through a cold start, the
// deadline's 503 + Retry-After, route switches, and hostile clients — malformed and huge
// bodies, unknown models, slow and idle connections, a bounded mutation fuzz — with the
// process's memory checked to stay bounded.
#include "gateway/connection_pool.hpp"
#include "gateway/gateway_server.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

namespace thaw::gateway {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A worker: answers /v1/completions with its tag and the prompt's tokens + 1; streams three
// events 200 ms apart when `streams` and the request asks for it; waits `delay` first.
class FakeWorker {
 public:
  FakeWorker(std::string tag, bool streams = false, std::chrono::milliseconds delay = 0ms)
      : tag_(std::move(tag)) {
    server_.Post("/v1/completions", [this, streams, delay](const httplib::Request& req,
                                                           httplib::Response& res) {
      ++requests;
      std::this_thread::sleep_for(delay);
      json body = json::parse(req.body, nullptr, false);
      std::vector<int> tokens;
      try {
        for (int t : body.value("prompt", std::vector<int>{})) tokens.push_back(t + 1);
      } catch (const json::exception&) {
        res.status = 400;  // what an engine says about a prompt it cannot read
        res.set_content(R"({"error":{"message":"bad prompt"}})", "application/json");
        return;
      }
      if (streams && body.value("stream", false)) {
        res.set_chunked_content_provider(
            "text/event-stream", [this, tokens](std::size_t, httplib::DataSink& sink) {
              for (int t : tokens) {
                std::string event =
                    "data: " + json{{"choices", {{{"token_ids", {t}}, {"text", tag_}}}}}.dump() +
                    "\n\n";
                if (!sink.write(event.data(), event.size())) return false;
                std::this_thread::sleep_for(200ms);
              }
              sink.write("data: [DONE]\n\n", 14);
              sink.done();
              return true;
            });
        return;
      }
      json out{
          {"id", "cmpl-1"},
          {"object", "text_completion"},
          {"created", 1},
          {"model", body.value("model", "")},
          {"choices",
           {{{"index", 0}, {"text", tag_}, {"token_ids", tokens}, {"finish_reason", "length"}}}}};
      res.set_content(out.dump(), "application/json");
    });
    port = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~FakeWorker() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  int port = 0;
  std::atomic<int> requests{0};

 private:
  std::string tag_;
  httplib::Server server_;
  std::thread thread_;
};

class FakeControlPlane final : public ControlPlane {
 public:
  void request_cold_start(const std::string& model) override {
    ++asks;
    if (on_cold_start) on_cold_start(model);
  }
  void report_load(const std::vector<ModelLoadSample>& samples) override {
    std::lock_guard lock(mutex);
    for (const auto& s : samples) reports.push_back(s);
  }
  std::function<void(const std::string&)> on_cold_start;
  std::atomic<int> asks{0};
  std::mutex mutex;
  std::vector<ModelLoadSample> reports;
};

std::size_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmRSS:")) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

class GatewayHttpTest : public ::testing::Test {
 protected:
  void start(RouteMap routes, RouterOptions router_options = {}, GatewayOptions options = {}) {
    router_ = std::make_unique<Router>(
        router_options, [this](const std::string& m) { control_.request_cold_start(m); });
    router_->replace(std::move(routes));
    options.port = 0;
    options.retry_after_s = 7;
    auto server = GatewayServer::start(options, *router_, control_);
    ASSERT_TRUE(server) << server.error();
    server_ = std::move(*server);
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(30, 0);
    for (int i = 0; i < 200 && !client_->Get("/health"); ++i) std::this_thread::sleep_for(10ms);
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  httplib::Result complete(const json& body) {
    return client_->Post("/v1/completions", body.dump(), "application/json");
  }
  static json error_of(const httplib::Result& r) {
    EXPECT_TRUE(r);
    if (!r) return {};
    json body = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(body.is_object() && body.contains("error")) << r->status << " " << r->body;
    return body.is_object() && body.contains("error") ? body["error"] : json{};
  }

  FakeControlPlane control_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<GatewayServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(GatewayHttpTest, ProxiesTheWorkersAnswerUnchanged) {
  FakeWorker worker("w");
  start({{"m", {{worker.url()}}}});
  json body{{"model", "m"}, {"prompt", {1, 2, 3}}, {"max_tokens", 3}};
  auto direct = httplib::Client("127.0.0.1", worker.port)
                    .Post("/v1/completions", body.dump(), "application/json");
  auto via = complete(body);
  ASSERT_TRUE(direct && via);
  EXPECT_EQ(via->status, 200);
  EXPECT_EQ(via->body, direct->body);
  EXPECT_EQ(json::parse(via->body)["choices"][0]["token_ids"], json({2, 3, 4}));
}

TEST_F(GatewayHttpTest, StreamingRelaysTheWorkersEventsAsTheyCome) {
  FakeWorker worker("w", /*streams=*/true);
  start({{"m", {{worker.url()}}}});
  json body{{"model", "m"}, {"prompt", {1, 2, 3}}, {"stream", true}};
  std::string received;
  Clock::duration first_event{};
  const auto t0 = Clock::now();
  auto res = client_->Post("/v1/completions", httplib::Headers{}, body.dump(), "application/json");
  ASSERT_TRUE(res);  // the whole answer, for its bytes
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_NE(res->body.find(R"("token_ids":[2])"), std::string::npos) << res->body;
  EXPECT_TRUE(res->body.ends_with("data: [DONE]\n\n"));
  // Its timing: the first event arrives while the worker is still producing the others.
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* d, std::size_t n, std::uint64_t, std::uint64_t) {
    if (received.empty()) first_event = Clock::now() - t0;
    received.append(d, n);
    return true;
  };
  httplib::Response r2;
  httplib::Error error;
  const auto t1 = Clock::now();
  first_event = {};
  ASSERT_TRUE(client_->send(req, r2, error));
  const auto total = Clock::now() - t1;
  EXPECT_EQ(received, res->body);
  EXPECT_LT(first_event - (t1 - t0), total - 300ms) << "the events were not relayed as they came";
}

TEST_F(GatewayHttpTest, StreamingFromAWorkerThatDoesNotStreamMakesEventsFromItsAnswer) {
  FakeWorker worker("w");
  start({{"m", {{worker.url()}}}});
  auto res = complete({{"model", "m"}, {"prompt", {5, 6}}, {"stream", true}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  ASSERT_TRUE(res->body.starts_with("data: ")) << res->body;
  const auto end = res->body.find("\n\n");
  json event = json::parse(res->body.substr(6, end - 6));
  EXPECT_EQ(event["object"], "text_completion");
  EXPECT_EQ(event["choices"][0]["token_ids"], json({6, 7}));
  EXPECT_TRUE(res->body.ends_with("data: [DONE]\n\n"));
}

TEST_F(GatewayHttpTest, HoldsDuringAColdStartThenAnswers) {
  FakeWorker worker("w");
  start({{"m", {{"", WorkerState::cold_starting}}}});
  std::thread later([&] {
    std::this_thread::sleep_for(400ms);
    router_->replace({{"m", {{worker.url()}}}});
  });
  const auto t0 = Clock::now();
  auto res = complete({{"model", "m"}, {"prompt", {1}}});
  later.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_GE(Clock::now() - t0, 390ms);
  EXPECT_EQ(control_.asks.load(), 0);  // one was already under way
}

TEST_F(GatewayHttpTest, AsksForAColdStartWhenAModelHasNoWorker) {
  FakeWorker worker("w");
  control_.on_cold_start = [&](const std::string& model) {
    // The coordinator plans, the worker comes up, a route push arrives.
    std::thread([this, model, url = worker.url()] {
      router_->replace({{model, {{"", WorkerState::cold_starting}}}});
      std::this_thread::sleep_for(300ms);
      router_->replace({{model, {{url}}}});
    }).detach();
  };
  start({{"m", {}}});
  std::vector<std::future<httplib::Result>> answers;
  for (int i = 0; i < 4; ++i) {
    answers.push_back(std::async(std::launch::async, [&] {
      httplib::Client c("127.0.0.1", server_->port());
      return c.Post("/v1/completions", json{{"model", "m"}, {"prompt", {1}}}.dump(),
                    "application/json");
    }));
  }
  for (auto& a : answers) {
    auto res = a.get();
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
  EXPECT_EQ(control_.asks.load(), 1);
}

TEST_F(GatewayHttpTest, DeadlineAnswers503WithRetryAfter) {
  RouterOptions o;
  o.hold_deadline = 300ms;
  start({{"m", {{"", WorkerState::cold_starting}}}}, o);
  const auto t0 = Clock::now();
  auto res = complete({{"model", "m"}, {"prompt", {1}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "7");
  EXPECT_EQ(error_of(res)["code"], "model_not_ready");
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST_F(GatewayHttpTest, FullHoldQueueAnswers503AtOnce) {
  RouterOptions o;
  o.hold_queue = 1;
  o.hold_deadline = 1500ms;
  start({{"m", {{"", WorkerState::cold_starting}}}}, o);
  auto held = std::async(std::launch::async, [&] {
    httplib::Client c("127.0.0.1", server_->port());
    return c.Post("/v1/completions", R"({"model":"m"})", "application/json");
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  auto res = complete({{"model", "m"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(error_of(res)["code"], "queue_full");
  EXPECT_EQ(res->get_header_value("Retry-After"), "7");
  EXPECT_LT(Clock::now() - t0, 500ms);
  EXPECT_EQ(held.get()->status, 503);
}

TEST_F(GatewayHttpTest, RouteSwitchLeavesInFlightRequestsWhereTheyAre) {
  FakeWorker stage0("pipeline", false, 600ms), full("full");
  start({{"m", {{stage0.url()}}}});
  auto in_flight = std::async(std::launch::async, [&] {
    httplib::Client c("127.0.0.1", server_->port());
    return c.Post("/v1/completions", R"({"model":"m","prompt":[1]})", "application/json");
  });
  std::this_thread::sleep_for(200ms);
  router_->replace({{"m", {{stage0.url(), WorkerState::draining}, {full.url()}}}});
  auto fresh = complete({{"model", "m"}, {"prompt", {1}}});
  ASSERT_TRUE(fresh);
  EXPECT_EQ(json::parse(fresh->body)["choices"][0]["text"], "full");
  auto old = in_flight.get();
  ASSERT_TRUE(old);
  EXPECT_EQ(json::parse(old->body)["choices"][0]["text"], "pipeline");
  EXPECT_EQ(stage0.requests.load(), 1);
}

TEST_F(GatewayHttpTest, ModelsHealthReadyAndUnknownThings) {
  FakeWorker worker("w");
  start({{"a", {{worker.url()}}}, {"b", {}}});
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  json list = json::parse(models->body);
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][0]["id"], "a");
  EXPECT_EQ(client_->Get("/health")->status, 200);
  EXPECT_EQ(client_->Get("/ready")->status, 200);
  auto unknown = complete({{"model", "nope"}, {"prompt", {1}}});
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(error_of(unknown)["code"], "model_not_found");
  auto path = client_->Get("/v2/whatever");
  EXPECT_EQ(path->status, 404);
  EXPECT_EQ(error_of(path)["code"], "not_found");
  auto routes = json::parse(client_->Get("/gateway/routes")->body);
  EXPECT_EQ(routes["a"][0]["state"], "serving");
}

TEST_F(GatewayHttpTest, MalformedRequestsGetClear400s) {
  FakeWorker worker("w");
  start({{"m", {{worker.url()}}}});
  struct Case {
    std::string body;
    std::string code;
  } cases[] = {{"{not json", "invalid_json"},
               {"[1,2]", "invalid_json"},
               {R"({"prompt":[1]})", "missing_model"},
               {R"({"model":7})", "missing_model"},
               {R"({"model":""})", "missing_model"},
               {R"({"model":"m","stream":"yes"})", "invalid_stream"},
               {std::string(10'000, '[') + std::string(10'000, ']'), "invalid_json"}};
  for (const Case& c : cases) {
    auto res = client_->Post("/v1/completions", c.body, "application/json");
    ASSERT_TRUE(res) << c.body.substr(0, 40);
    EXPECT_EQ(res->status, 400) << c.body.substr(0, 40);
    EXPECT_EQ(error_of(res)["code"], c.code) << c.body.substr(0, 40);
  }
  EXPECT_EQ(worker.requests.load(), 0);
}

TEST_F(GatewayHttpTest, HugeBodiesAreRefusedWith413) {
  FakeWorker worker("w");
  GatewayOptions o;
  o.max_body_bytes = 64 << 10;
  start({{"m", {{worker.url()}}}}, {}, o);
  json big{{"model", "m"}, {"prompt", std::string(1 << 20, 'x')}};
  auto res = complete(big);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(error_of(res)["code"], "request_too_large");
  EXPECT_EQ(worker.requests.load(), 0);
  EXPECT_EQ(complete({{"model", "m"}, {"prompt", {1}}})->status, 200);
}

TEST_F(GatewayHttpTest, AWorkerThatIsGoneIsA502) {
  int dead_port;
  {
    FakeWorker gone("x");
    dead_port = gone.port;
  }
  start({{"m", {{"http://127.0.0.1:" + std::to_string(dead_port)}}}});
  auto res = complete({{"model", "m"}, {"prompt", {1}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 502);
  EXPECT_EQ(error_of(res)["code"], "upstream_unavailable");
  auto streamed = complete({{"model", "m"}, {"prompt", {1}}, {"stream", true}});
  ASSERT_TRUE(streamed);
  EXPECT_NE(streamed->body.find("upstream_unavailable"), std::string::npos);
  EXPECT_TRUE(streamed->body.ends_with("data: [DONE]\n\n"));
}

TEST_F(GatewayHttpTest, ARefusedConnectionIsRetriedOnAnotherWorker) {
  int dead_port;
  {
    FakeWorker gone("x");
    dead_port = gone.port;
  }
  FakeWorker live("live");
  start({{"m", {{"http://127.0.0.1:" + std::to_string(dead_port)}, {live.url()}}}});
  for (int i = 0; i < 4; ++i) {
    auto res = complete({{"model", "m"}, {"prompt", {1}}, {"stream", i % 2 == 1}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_NE(res->body.find("live"), std::string::npos) << res->body;
  }
  EXPECT_EQ(live.requests.load(), 4);
}

// A worker that crashes after taking a request: it reads the request and closes the
// connection without answering.
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

TEST_F(GatewayHttpTest, AWorkerThatCrashesMidRequestIsRetriedFromThePromptOnce) {
  CrashingWorker crashing;
  FakeWorker full("full");
  start({{"m", {{"http://127.0.0.1:" + std::to_string(crashing.port)}, {full.url()}}}});
  auto res = complete({{"model", "m"}, {"prompt", {1, 2}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["token_ids"], json({2, 3}));
  EXPECT_EQ(crashing.taken.load(), 1);
  EXPECT_EQ(full.requests.load(), 1);
  // With nothing else to go to, the one resend also fails: a 502, not a hang.
  router_->replace({{"m", {{"http://127.0.0.1:" + std::to_string(crashing.port)}}}});
  auto alone = complete({{"model", "m"}, {"prompt", {1}}});
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->status, 502);
  EXPECT_EQ(crashing.taken.load(), 3);
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A chunked body is refused before it is read (cpp-httplib 0.11 would read one of any size:
// its body limit holds only for Content-Length).
TEST_F(GatewayHttpTest, ChunkedBodiesAreRefusedBeforeTheyAreRead) {
  FakeWorker worker("w");
  GatewayOptions o;
  o.max_body_bytes = 64 << 10;
  start({{"m", {{worker.url()}}}}, {}, o);
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  // Nothing of the body is sent: the answer comes on the headers alone.
  timeval tv{5, 0};  // well under the client timeout: the answer must not wait for the body
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string answer;
  char buf[512];
  ssize_t n;
  // Until the JSON error has come (the server then reads the connection on: the bytes a
  // client would send next are taken as the next request, which fails to parse).
  while (answer.find("}}") == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
    answer.append(buf, n);
  }
  ::close(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 411")) << answer;
  EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
  EXPECT_NE(answer.find("length_required"), std::string::npos) << answer;
  EXPECT_EQ(worker.requests.load(), 0);
}

// Reads from `fd` until the peer closes or `limit` passes; what came.
std::string read_until_closed(int fd, std::chrono::milliseconds limit) {
  timeval tv{static_cast<time_t>(limit.count() / 1000),
             static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, n);
  return out;
}

// Connections that hold a thread without asking anything: idle keep-alive ones (one request
// answered, then silence), slow-header ones (a header byte every 300 ms, each inside the read
// timeout) and silent ones (connected, nothing sent). 16 of each, 12x the 4 ready threads.
// A thread-per-connection server with a fixed pool makes everyone else wait for them (measured
// with the old fixed pool of 4: ~2 s per request, a keep-alive timeout); the growing pool
// serves a new client at once.
TEST_F(GatewayHttpTest, IdleAndSlowConnectionsDoNotStallOthers) {
  FakeWorker worker("w");
  GatewayOptions o;
  o.client_timeout = 2s;
  o.keep_alive_timeout = 2s;
  o.threads = 4;
  o.max_connections = 256;
  start({{"m", {{worker.url()}}}}, {}, o);
  const std::size_t rss0 = rss_bytes();
  constexpr int kEach = 16;
  std::vector<int> idle, slow, silent;
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < kEach; ++i) {
    idle.push_back(connect_to(server_->port()));
    ASSERT_GE(idle.back(), 0);
    ASSERT_EQ(::send(idle.back(), get.data(), get.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(get.size()));
  }
  for (int fd : idle) {  // each answered, and kept open (keep-alive)
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[512];
    ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  }
  for (int i = 0; i < kEach; ++i) {
    silent.push_back(connect_to(server_->port()));
    slow.push_back(connect_to(server_->port()));
    ASSERT_GE(silent.back(), 0);
    ASSERT_GE(slow.back(), 0);
    ASSERT_EQ(::send(slow.back(), "GET /health HTTP/1.1\r\nX-Slow: ", 30, MSG_NOSIGNAL), 30);
  }
  std::atomic<bool> done{false};
  std::jthread dripper([&] {
    while (!done) {
      for (int fd : slow) ::send(fd, "a", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(300ms);
    }
  });
  struct StopDripping {
    std::atomic<bool>& done;
    ~StopDripping() { done = true; }
  } stop_dripping{done};
  std::this_thread::sleep_for(200ms);  // every connection accepted and on a thread
  // A normal client, on a new connection each time: answered within 500 ms (stated bound; on
  // this machine it takes ~1 ms), well inside the 2 s keep-alive/read timeouts the others hold
  // threads for.
  std::chrono::milliseconds worst{0};
  for (int i = 0; i < 5; ++i) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    const auto t0 = Clock::now();
    auto res = c.Post("/v1/completions", R"({"model":"m","prompt":[1]})", "application/json");
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    ASSERT_TRUE(res) << httplib::to_string(res.error()) << " after " << took.count() << " ms";
    EXPECT_EQ(res->status, 200);
    worst = std::max(worst, took);
  }
  std::printf("[ measured ] worst of 5 requests with %d idle + %d slow + %d silent open: %lld ms\n",
              kEach, kEach, kEach, static_cast<long long>(worst.count()));
  EXPECT_LT(worst, 500ms);
  // The idle and silent ones are closed by the server after the keep-alive timeout.
  for (int fd : idle) {
    read_until_closed(fd, 5s);
    char b;
    EXPECT_EQ(::recv(fd, &b, 1, MSG_DONTWAIT), 0) << "an idle connection is still open";
    ::close(fd);
  }
  for (int fd : silent) {
    read_until_closed(fd, 5s);
    char b;
    EXPECT_EQ(::recv(fd, &b, 1, MSG_DONTWAIT), 0) << "a silent connection is still open";
    ::close(fd);
  }
  done = true;
  dripper.join();
  for (int fd : slow) ::close(fd);
#if defined(__SANITIZE_ADDRESS__)
  (void)rss0;  // ASan's quarantine and per-thread caches: checked in the default build
#else
  EXPECT_LT(rss_bytes(), rss0 + (64u << 20)) << "memory grew with idle connections";
#endif
}

// 300 clients connecting at once: none waits for a SYN to be resent (1 s), which is what a
// listen queue of cpp-httplib's 5 did to most of them (median 1.02 s before it was widened).
TEST_F(GatewayHttpTest, ABurstOfConnectionsFitsTheListenQueue) {
  FakeWorker worker("w");
  start({{"m", {{worker.url()}}}});
  constexpr int kClients = 300;
  std::vector<std::chrono::milliseconds> took(kClients);
  std::atomic<bool> go{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      const auto t0 = Clock::now();
      const int fd = connect_to(server_->port());
      took[i] = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
      if (fd < 0) took[i] = std::chrono::hours(1);
      if (fd >= 0) ::close(fd);
    });
  }
  go = true;
  for (auto& c : clients) c.join();
  std::sort(took.begin(), took.end());
  std::printf("[ measured ] %d simultaneous connects: median %lld ms, max %lld ms\n", kClients,
              static_cast<long long>(took[kClients / 2].count()),
              static_cast<long long>(took.back().count()));
  EXPECT_LT(took.back(), 900ms) << "a connect waited for a resent SYN";
}

// Past --max-connections a new connection is answered 503 at once (not queued behind the
// ones that hold every thread), and served again once those are gone.
TEST_F(GatewayHttpTest, ConnectionsPastTheLimitGet503AtOnce) {
  FakeWorker worker("w");
  GatewayOptions o;
  o.client_timeout = 2s;
  o.keep_alive_timeout = 2s;
  o.threads = 2;
  o.max_connections = 8;
  start({{"m", {{worker.url()}}}}, {}, o);
  std::this_thread::sleep_for(100ms);  // start()'s own probe connection is closed
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(connect_to(server_->port()));
    ASSERT_GE(held.back(), 0);
  }
  std::this_thread::sleep_for(200ms);
  httplib::Client c("127.0.0.1", server_->port());
  c.set_read_timeout(30, 0);
  const auto t0 = Clock::now();
  auto res = c.Get("/health");
  const auto took = Clock::now() - t0;
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_EQ(error_of(res).value("code", json()), "too_many_connections");
  EXPECT_EQ(res->get_header_value("Retry-After"), "7");
  EXPECT_EQ(res->get_header_value("Connection"), "close");
  EXPECT_LT(took, 500ms);
  for (int fd : held) ::close(fd);
  // The closed connections' threads are free again within the keep-alive poll.
  std::this_thread::sleep_for(300ms);
  auto again = c.Get("/health");
  ASSERT_TRUE(again) << httplib::to_string(again.error());
  EXPECT_EQ(again->status, 200);
}

// The pool on its own: it grows to max_connections busy threads, runs the next job on the
// overflow lane (where over_limit() is true), and shrinks back to its ready threads once
// the extra ones have been idle for idle_exit.
TEST(ConnectionPool, GrowsToTheLimitOverflowsThenShrinks) {
  ConnectionPool pool({.ready = 2,
                       .max_connections = 6,
                       .overflow_threads = 1,
                       .overflow_queue = 4,
                       .idle_exit = 200ms});
  EXPECT_EQ(pool.counts().threads, 2u);
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> started{0}, over{0};
  auto job = [&] {
    if (ConnectionPool::over_limit()) ++over;
    ++started;
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return release; });
  };
  for (int i = 0; i < 6; ++i) pool.enqueue(job);
  for (int i = 0; i < 200 && started < 6; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(started.load(), 6) << "6 jobs at once need 6 threads";
  EXPECT_EQ(over.load(), 0);
  EXPECT_EQ(pool.counts().threads, 6u);
  EXPECT_EQ(pool.counts().busy, 6u);
  std::atomic<bool> overflow_ran{false}, overflow_flag{false};
  pool.enqueue([&] {
    overflow_flag = ConnectionPool::over_limit();
    overflow_ran = true;
  });
  for (int i = 0; i < 200 && !overflow_ran; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(overflow_ran) << "the 7th job waited for a busy thread";
  EXPECT_TRUE(overflow_flag) << "the 7th job did not run on the overflow lane";
  EXPECT_EQ(pool.counts().threads, 6u) << "the pool grew past max_connections";
  {
    std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  for (int i = 0; i < 200 && pool.counts().busy > 0; ++i) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(600ms);  // idle_exit, and a margin
  pool.enqueue([] {});                 // the acceptor's next enqueue joins the ended threads
  for (int i = 0; i < 200 && pool.counts().threads > 2; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(pool.counts().threads, 2u);
  pool.shutdown();
}

// With API keys: /v1/* and /gateway/* need "Authorization: Bearer KEY" (401 with an
// OpenAI-style body and WWW-Authenticate otherwise); /health and /ready stay open.
TEST_F(GatewayHttpTest, ApiKeysGuardTheApiButNotHealth) {
  FakeWorker worker("w");
  GatewayOptions o;
  o.api_keys = ApiKeys::from_keys({"first-key-0123456789", "second-key-0123456789"});
  start({{"m", {{worker.url()}}}}, {}, o);
  const std::string body = R"({"model":"m","prompt":[1]})";
  auto none = client_->Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(error_of(none).value("code", json()), "invalid_api_key");
  EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer");
  // Its body was not read, so the connection must not carry another request.
  EXPECT_EQ(none->get_header_value("Connection"), "close");
  for (const char* wrong : {"Bearer first-key-012345678", "Bearer first-key-0123456789x",
                            "Basic Zmlyc3Qta2V5LTAxMjM0NTY3ODk=", "first-key-0123456789", "Bearer ",
                            "Bearer first-key-0123456789 second-key-0123456789"}) {
    auto r = client_->Post("/v1/completions", {{"Authorization", wrong}}, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << wrong;
    EXPECT_EQ(error_of(r).value("code", json()), "invalid_api_key") << wrong;
  }
  EXPECT_EQ(worker.requests.load(), 0);
  for (const char* right : {"Bearer first-key-0123456789", "bearer second-key-0123456789",
                            "Bearer   second-key-0123456789 "}) {
    auto r = client_->Post("/v1/completions", {{"Authorization", right}}, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << right << ": " << r->body;
  }
  EXPECT_EQ(worker.requests.load(), 3);
  for (const char* path : {"/v1/models", "/gateway/routes"}) {
    auto r = client_->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    auto ok = client_->Get(path, {{"Authorization", "Bearer first-key-0123456789"}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << path;
  }
  for (const char* path : {"/health", "/ready"}) {
    auto r = client_->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << path;
  }
}

// A scratch directory, removed with what is in it.
struct ScratchDir {
  ScratchDir() {
    char tmpl[] = "/tmp/thaw-gateway-test.XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~ScratchDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string p = path + "/" + name;
    std::ofstream(p) << text;
    chmod(p.c_str(), mode);
    return p;
  }
  std::string path;
};

TEST(GatewayApiKeyFile, ModeAndContentsAreChecked) {
  ScratchDir dir;
  const std::string keys = "# gateway keys\n\n  alpha-0123456789abcdef  \nbeta-0123456789abcdef\n";
  auto world = ApiKeys::load(dir.write("world", keys, 0644));
  ASSERT_FALSE(world);
  EXPECT_NE(world.error().find("other users can read"), std::string::npos) << world.error();
  EXPECT_NE(world.error().find("chmod o-rw"), std::string::npos) << world.error();
  EXPECT_FALSE(ApiKeys::load(dir.write("writable", keys, 0602)));
  auto fine = ApiKeys::load(dir.write("fine", keys, 0640));
  ASSERT_TRUE(fine) << fine.error();
  EXPECT_EQ(fine->size(), 2u);
  EXPECT_TRUE(fine->accepts("Bearer alpha-0123456789abcdef"));
  EXPECT_TRUE(fine->accepts("Bearer beta-0123456789abcdef"));
  EXPECT_FALSE(fine->accepts("Bearer # gateway keys"));
  auto empty = ApiKeys::load(dir.write("empty", "# none yet\n", 0600));
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().find("no keys"), std::string::npos) << empty.error();
  auto short_key = ApiKeys::load(dir.write("short", "abc\n", 0600));
  ASSERT_FALSE(short_key);
  EXPECT_NE(short_key.error().find("line 1"), std::string::npos) << short_key.error();
  EXPECT_FALSE(ApiKeys::load(dir.path + "/missing"));
  EXPECT_FALSE(ApiKeys::load(dir.path));  // a directory
}

// --tls-cert/--tls-key: HTTPS with a self-signed certificate made here (openssl CLI), verified
// by the client against that certificate; plain HTTP on the port gets no answer.
TEST(GatewayTls, ServesHttpsWithTheGivenCertificate) {
  ScratchDir dir;
  const std::string cert = dir.path + "/cert.pem", key = dir.path + "/key.pem";
  const std::string make =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1"
      " -addext subjectAltName=IP:127.0.0.1 -keyout " +
      key + " -out " + cert + " 2>/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  FakeWorker worker("w");
  FakeControlPlane control;
  Router router({}, [](const std::string&) {});
  router.replace({{"m", {{worker.url()}}}});
  GatewayOptions o;
  o.port = 0;
  o.tls_cert = cert;
  o.tls_key = key;
  auto server = GatewayServer::start(o, router, control);
  ASSERT_TRUE(server) << server.error();
  std::thread runner([&] { (*server)->run(); });
  struct Stop {
    GatewayServer& s;
    std::thread& t;
    ~Stop() {
      s.stop();
      t.join();
    }
  } stop{**server, runner};
  httplib::SSLClient tls("127.0.0.1", (*server)->port());
  tls.set_ca_cert_path(cert.c_str());
  tls.enable_server_certificate_verification(true);
  for (int i = 0; i < 200 && !tls.Get("/health"); ++i) std::this_thread::sleep_for(10ms);
  auto health = tls.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  auto res = tls.Post("/v1/completions", R"({"model":"m","prompt":[4]})", "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["choices"][0]["token_ids"], json::array({5}));
  httplib::SSLClient untrusting("127.0.0.1", (*server)->port());  // the system's CAs only
  untrusting.enable_server_certificate_verification(true);
  EXPECT_FALSE(untrusting.Get("/health")) << "a self-signed certificate was trusted";
  httplib::Client plain("127.0.0.1", (*server)->port());
  plain.set_read_timeout(2, 0);
  auto refused = plain.Get("/health");
  EXPECT_TRUE(!refused || refused->status != 200);

  // A key that does not match the certificate, or files that are not there: refused at start.
  const std::string other = dir.path + "/other.pem";
  ASSERT_EQ(std::system(("openssl genrsa -out " + other + " 2048 2>/dev/null").c_str()), 0);
  o.tls_key = other;
  auto mismatch = GatewayServer::start(o, router, control);
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.error().find("--tls-cert"), std::string::npos) << mismatch.error();
  o.tls_key = "";
  EXPECT_FALSE(GatewayServer::start(o, router, control));
}

// Mutations of valid requests (bit flips, truncations, insertions, repeated bytes): every one
// gets an HTTP answer with a JSON error body or the worker's answer, the gateway stays up, and
// its memory stays bounded. A bounded run for ctest; not a coverage-guided fuzzer.
TEST_F(GatewayHttpTest, MutatedRequestsAlwaysGetAnAnswerAndMemoryStaysBounded) {
  FakeWorker worker("w");
  GatewayOptions o;
  o.max_body_bytes = 16 << 10;
  RouterOptions r;
  r.hold_deadline = 50ms;
  start({{"m", {{worker.url()}}}, {"cold", {{"", WorkerState::cold_starting}}}}, r, o);
  const std::vector<std::string> seeds = {
      R"({"model":"m","prompt":[1,2,3],"max_tokens":4})",
      R"({"model":"m","prompt":"hello","stream":true})", R"({"model":"cold","prompt":[1]})",
      R"({"model":"m","prompt":[[1,2],[3]],"temperature":0,"extra":{"a":[null,true,1.5e3]}})"};
  std::mt19937 rng(25);
  const std::size_t rss0 = rss_bytes();
  int answered = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string body = seeds[rng() % seeds.size()];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const std::size_t at = rng() % body.size();
      switch (rng() % 5) {
        case 0:
          body[at] = static_cast<char>(body[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          body.resize(at);
          break;
        case 2:
          body.insert(at, 1, "{}[]\",:\\0x"[rng() % 10]);
          break;
        case 3:
          body.insert(at, std::string(rng() % 20'000, body[at]));
          break;
        case 4:
          body.erase(at, 1);
          break;
      }
    }
    auto res = client_->Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(res) << "no answer to mutation " << i << ": " << httplib::to_string(res.error())
                     << " for " << body.size() << " bytes: " << body.substr(0, 80);
    const int s = res->status;
    ASSERT_TRUE(s == 200 || s == 400 || s == 404 || s == 413 || s == 502 || s == 503)
        << s << " for " << body.substr(0, 80);
    if (s != 200) {
      json e = json::parse(res->body, nullptr, false);
      ASSERT_TRUE(e.is_object() && e.contains("error")) << s << " " << res->body.substr(0, 200);
    }
    ++answered;
  }
  EXPECT_EQ(answered, 1500);
  EXPECT_EQ(client_->Get("/health")->status, 200);
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan freed memory waits in its quarantine (up to 256 MiB) before reuse: RSS says
  // nothing about the gateway's own bound there. Checked in the default build.
  (void)rss0;
#else
  EXPECT_LT(rss_bytes(), rss0 + (64u << 20));
#endif
}

TEST_F(GatewayHttpTest, LoadIsReportedEveryInterval) {
  FakeWorker worker("w", false, 300ms);
  GatewayOptions o;
  o.report_interval = 100ms;
  start({{"m", {{worker.url()}}}}, {}, o);
  std::vector<std::future<httplib::Result>> answers;
  for (int i = 0; i < 3; ++i) {
    answers.push_back(std::async(std::launch::async, [&] {
      httplib::Client c("127.0.0.1", server_->port());
      return c.Post("/v1/completions", R"({"model":"m","prompt":[1]})", "application/json");
    }));
  }
  for (auto& a : answers) EXPECT_EQ(a.get()->status, 200);
  std::this_thread::sleep_for(250ms);
  std::lock_guard lock(control_.mutex);
  std::uint64_t arrivals = 0, peak = 0;
  for (const auto& s : control_.reports) {
    EXPECT_EQ(s.model, "m");
    arrivals += s.arrivals;
    peak = std::max(peak, s.concurrent);
    EXPECT_NEAR(s.window_s, 0.1, 0.05);
  }
  EXPECT_EQ(arrivals, 3u);
  EXPECT_EQ(peak, 3u);  // all three were in flight during a window (the worker takes 300 ms)
  EXPECT_GE(control_.reports.size(), 5u);
}

}  // namespace
}  // namespace thaw::gateway
