// Issue 10's control-plane benchmark: 1,000 agents heartbeating at 1 Hz must cost the
// coordinator less than 10 % of one core.
//
// Runs the real thaw-coordinator binary as a child (a temporary key, and an allow directory
// holding one generated key per agent), then plays N node agents in this process: N DEALER
// sockets, each with its own CURVE key and its node id as routing id, spread over a few
// ZeroMQ contexts and threads. Every agent registers, then sends one heartbeat a second, the
// N agents spread evenly over the second, and counts the coordinator's heartbeats it gets.
// After a warm-up (CURVE handshakes and registrations are not what is measured) the
// coordinator's utime + stime (/proc/PID/stat, every thread: the run loop, ZeroMQ's I/O
// thread doing the CURVE work, the ZAP thread) is read at the start and end of the
// measured window. At the end a state request on the frontend counts the nodes alive.
//
//   thaw-heartbeat-bench [--agents 1000] [--seconds 30] [--warmup 5] [--threads 2]
//                        [--zmtp-heartbeat 30000] [--coordinator PATH]
//
// Exit status 0 when every agent stayed alive and got the coordinator's heartbeats
// throughout, whatever the CPU figure (the verdict on it is the last line).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/proto/cluster/cluster_codec.hpp"
#include "common/zmq/curve_keys.hpp"

extern char** environ;

namespace {

namespace v1 = thaw::cluster::v1;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct CpuTime {
  double user = 0, system = 0;  // seconds, every thread of the process
  double total() const { return user + system; }
};

// utime and stime from /proc/PID/stat (clock ticks: 10 ms resolution at 100 Hz).
CpuTime process_cpu(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(in, line);
  // The command name (field 2) may hold spaces: fields are counted after its ')'.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return {static_cast<double>(utime) / tick, static_cast<double>(stime) / tick};
}

// A directory removed with its contents at exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "thaw-hb-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// thaw-coordinator as a child; its stderr is read on a thread (it logs every registration,
// and a full pipe would stall it) for the bound endpoint and lines that matter here.
class Coordinator {
 public:
  ~Coordinator() { stop(); }

  std::optional<std::string> start(const std::vector<std::string>& argv) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) return std::nullopt;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipefd[1]);
    if (rc != 0) {
      ::close(pipefd[0]);
      fmt::print(stderr, "cannot start {}: {}\n", argv[0], std::strerror(rc));
      pid_ = -1;
      return std::nullopt;
    }
    auto endpoint = endpoint_.get_future();
    reader_ = std::thread([this, fd = pipefd[0]] { read_log(fd); });
    if (endpoint.wait_for(30s) != std::future_status::ready) return std::nullopt;
    std::string e = endpoint.get();
    if (e.empty()) return std::nullopt;
    return e;
  }

  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }
  int dead_lines() const { return dead_.load(); }
  std::string last_lines() {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const std::string& l : tail_) out += "  " + l + "\n";
    return out;
  }

 private:
  void read_log(int fd) {
    std::string buffer;
    char chunk[4096];
    bool announced = false;
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n <= 0) break;
      buffer.append(chunk, static_cast<std::size_t>(n));
      for (std::size_t nl; (nl = buffer.find('\n')) != std::string::npos; buffer.erase(0, nl + 1)) {
        const std::string line = buffer.substr(0, nl);
        if (line.find("declared dead") != std::string::npos) dead_.fetch_add(1);
        constexpr std::string_view kServing = "serving nodes on ";
        if (const auto at = line.find(kServing); !announced && at != std::string::npos) {
          const auto from = at + kServing.size();
          endpoint_.set_value(line.substr(from, line.find(' ', from) - from));
          announced = true;
        }
        std::lock_guard lock(mutex_);
        tail_.push_back(line);
        if (tail_.size() > 8) tail_.erase(tail_.begin());
      }
    }
    if (!announced) endpoint_.set_value("");
    ::close(fd);
  }

  pid_t pid_ = -1;
  std::promise<std::string> endpoint_;
  std::thread reader_;
  std::atomic<int> dead_{0};
  std::mutex mutex_;
  std::vector<std::string> tail_;
};

struct Agent {
  std::string id;
  thaw::zmqx::CurveKeyPair key;
  double offset = 0;  // its heartbeats' phase within each second
  std::uint64_t sequence = 0;
  bool welcomed = false;
  Clock::time_point welcomed_at;
  std::uint64_t reregisters_in_window = 0;
  std::uint64_t beats_in_window = 0;  // the coordinator's heartbeats it got while measured
  std::uint64_t reregisters = 0;
};

struct Window {
  Clock::time_point t0, begin, end;
};

// One thread's agents, on their own ZeroMQ context (its own I/O thread).
struct Shard {
  zmq::context_t context{1};
  std::vector<Agent*> agents;
  std::vector<zmq::socket_t> sockets;
  std::uint64_t sent_in_window = 0;
  std::uint64_t received_in_window = 0;
  std::uint64_t invalid = 0;
};

void send(zmq::socket_t& socket, v1::NodeMessage message) {
  const std::string payload = thaw::cluster::encode(std::move(message));
  (void)socket.send(zmq::buffer(payload), zmq::send_flags::dontwait);
}

v1::NodeMessage registration(const std::string& id) {
  v1::NodeMessage m;
  v1::Register* r = m.mutable_register_();
  r->set_node_id(id);
  r->set_thaw_version("heartbeat-bench");
  r->set_network_bytes_per_s(2e9);
  v1::GpuInfo* gpu = r->add_gpus();
  gpu->set_index(0);
  gpu->set_memory_bytes(72ull << 30);
  gpu->set_free_bytes(72ull << 30);
  gpu->set_pcie_bytes_per_s(25e9);
  return m;
}

// Reads what the coordinator sent to agent `i` of the shard; returns messages read.
int drain(Shard& shard, std::size_t i, bool in_window) {
  int read = 0;
  zmq::message_t frame;
  while (shard.sockets[i].recv(frame, zmq::recv_flags::dontwait)) {
    ++read;
    Agent& agent = *shard.agents[i];
    auto message = thaw::cluster::decode_coordinator_message(frame.to_string_view());
    if (!message) {
      ++shard.invalid;
      continue;
    }
    switch (message->body_case()) {
      case v1::CoordinatorMessage::kWelcome:
        if (!agent.welcomed) agent.welcomed_at = Clock::now();
        agent.welcomed = true;
        break;
      case v1::CoordinatorMessage::kHeartbeat:
        if (in_window) {
          ++agent.beats_in_window;
          ++shard.received_in_window;
        }
        break;
      case v1::CoordinatorMessage::kReRegister:
        // What thawd's agent does; counted, since it means the coordinator lost the node.
        ++agent.reregisters;
        if (in_window) ++agent.reregisters_in_window;
        send(shard.sockets[i], registration(agent.id));
        break;
      default:
        break;
    }
  }
  return read;
}

// Heartbeats on schedule: agent with offset f sends at t0 + k + f for k = 0, 1, ...
// Sockets are watched through their ZMQ_FDs in one epoll set, so a wake-up costs work for
// the sockets that have something, not a zmq_poll over all of them (the agents share the
// machine with the coordinator: the less they take, the less they disturb it).
void run_shard(Shard& shard, const Window& w) {
  const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
  for (std::size_t i = 0; i < shard.sockets.size(); ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    ::epoll_ctl(epoll, EPOLL_CTL_ADD, shard.sockets[i].get(zmq::sockopt::fd), &ev);
  }
  std::size_t cursor = 0;
  std::int64_t round = 0;
  const auto due = [&] {
    return w.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                      static_cast<double>(round) + shard.agents[cursor]->offset));
  };
  std::vector<epoll_event> ready(256);
  // Registrations were sent before the schedule: read whatever already came.
  for (std::size_t i = 0; i < shard.sockets.size(); ++i) drain(shard, i, false);
  for (;;) {
    auto now = Clock::now();
    if (now >= w.end) break;
    for (auto at = due(); at <= now; at = due()) {
      v1::NodeMessage beat;
      beat.mutable_heartbeat()->set_sequence(++shard.agents[cursor]->sequence);
      send(shard.sockets[cursor], std::move(beat));
      if (at >= w.begin && at < w.end) ++shard.sent_in_window;
      // A send may take the mailbox's signal with it: read what is there now.
      drain(shard, cursor, now >= w.begin);
      if (++cursor == shard.agents.size()) {
        cursor = 0;
        ++round;
      }
    }
    const auto wake = std::min(due(), w.end);
    const auto timeout = std::chrono::ceil<std::chrono::milliseconds>(
        std::max(wake - Clock::now(), Clock::duration::zero()));
    const int n = ::epoll_wait(epoll, ready.data(), static_cast<int>(ready.size()),
                               static_cast<int>(timeout.count()));
    now = Clock::now();
    for (int i = 0; i < n; ++i) {
      drain(shard, static_cast<std::size_t>(ready[static_cast<std::size_t>(i)].data.u64),
            now >= w.begin && now < w.end);
    }
  }
  ::close(epoll);
}

std::optional<v1::ClusterState> cluster_state(const std::string& frontend) {
  zmq::context_t context(1);
  zmq::socket_t req(context, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.connect(frontend);
  v1::FrontendRequest request;
  request.mutable_state();
  const std::string payload = thaw::cluster::encode(std::move(request));
  if (!req.send(zmq::buffer(payload))) return std::nullopt;
  zmq::pollitem_t item{req.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, 10s) == 0) return std::nullopt;
  zmq::message_t reply;
  if (!req.recv(reply)) return std::nullopt;
  auto decoded = thaw::cluster::decode_frontend_reply(reply.to_string_view());
  if (!decoded || !decoded->error().empty()) return std::nullopt;
  return decoded->state();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"thaw-heartbeat-bench: the coordinator's CPU with N agents heartbeating at 1 Hz"};
  int agents = 1000, seconds = 30, warmup = 5, threads = 2, zmtp_ms = 30'000;
  std::string coordinator_path = THAW_COORDINATOR_PATH;
  app.add_option("--agents", agents, "node agents (DEALER sockets)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--seconds", seconds, "measured window")
      ->check(CLI::Range(2, 3600))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "seconds of heartbeats before the window")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  app.add_option("--threads", threads, "threads (and ZeroMQ contexts) playing the agents")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--zmtp-heartbeat", zmtp_ms,
                 "the agents' ZMTP heartbeat interval in ms, as thawd's agent sets it "
                 "(30 s: they only drop dead TCP); 0 = off (the coordinator's own are on "
                 "either way)")
      ->check(CLI::Range(0, 60000))
      ->capture_default_str();
  app.add_option("--coordinator", coordinator_path, "the thaw-coordinator binary to measure")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  threads = std::min(threads, agents);

  if (auto ok = thaw::zmqx::curve_available(); !ok) {
    fmt::print(stderr, "{}\n", ok.error());
    return 1;
  }
  // Two descriptors per agent here (the socket's mailbox, its TCP connection) and one per
  // agent in the coordinator, which inherits the limit.
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < static_cast<rlim_t>(2 * agents + 256)) {
    fmt::print(stderr, "open file limit {} is too low for {} agents\n", files.rlim_cur, agents);
    return 1;
  }

  TempDir dir;
  auto coordinator_key = thaw::zmqx::write_key_pair(dir.path() / "coordinator");
  if (!coordinator_key) {
    fmt::print(stderr, "{}\n", coordinator_key.error());
    return 1;
  }
  std::filesystem::create_directory(dir.path() / "nodes.d");
  std::vector<Agent> all(static_cast<std::size_t>(agents));
  for (int i = 0; i < agents; ++i) {
    Agent& a = all[static_cast<std::size_t>(i)];
    a.id = fmt::format("node-{:05}", i);
    auto key = thaw::zmqx::generate_key_pair();
    if (!key) {
      fmt::print(stderr, "{}\n", key.error());
      return 1;
    }
    a.key = *key;
    a.offset = static_cast<double>(i) / agents;
    std::ofstream(dir.path() / "nodes.d" / (a.id + ".pub")) << a.key.public_z85 << "\n";
  }

  const std::string frontend = "ipc://" + (dir.path() / "frontend.sock").string();
  Coordinator coordinator;
  const auto endpoint = coordinator.start(
      {coordinator_path, "serve", "--nodes", "tcp://127.0.0.1:*", "--frontend", frontend, "--key",
       (dir.path() / "coordinator.key").string(), "--allow", (dir.path() / "nodes.d").string()});
  if (!endpoint) {
    fmt::print(stderr, "thaw-coordinator did not start:\n{}", coordinator.last_lines());
    return 1;
  }

  // Agent i goes to shard i % threads, so each shard's agents are in offset order and
  // spread over the whole second.
  std::vector<std::unique_ptr<Shard>> shards;
  for (int t = 0; t < threads; ++t) {
    shards.push_back(std::make_unique<Shard>());
    shards.back()->context.set(zmq::ctxopt::max_sockets, agents / threads + 64);
  }
  for (int i = 0; i < agents; ++i) {
    Shard& shard = *shards[static_cast<std::size_t>(i % threads)];
    Agent& a = all[static_cast<std::size_t>(i)];
    zmq::socket_t s(shard.context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::routing_id, a.id);
    s.set(zmq::sockopt::curve_serverkey, coordinator_key->public_z85);
    s.set(zmq::sockopt::curve_publickey, a.key.public_z85);
    s.set(zmq::sockopt::curve_secretkey, a.key.secret_z85);
    // As thawd's agent: ZMTP heartbeats to notice dead TCP (its interval, liveness 3).
    if (zmtp_ms > 0) {
      s.set(zmq::sockopt::heartbeat_ivl, zmtp_ms);
      s.set(zmq::sockopt::heartbeat_timeout, 3 * zmtp_ms);
    }
    s.connect(*endpoint);
    send(s, registration(a.id));
    shard.agents.push_back(&a);
    shard.sockets.push_back(std::move(s));
  }

  // The schedule starts at once, as thawd's agent heartbeats right after registering (an
  // agent silent until all N were welcomed would be declared dead); registrations and
  // CURVE handshakes fall in the warm-up.
  Window w;
  w.t0 = Clock::now();
  w.begin = w.t0 + std::chrono::seconds(warmup);
  w.end = w.begin + std::chrono::seconds(seconds);
  std::vector<std::thread> workers;
  for (auto& shard : shards) workers.emplace_back([&s = *shard, &w] { run_shard(s, w); });

  std::this_thread::sleep_until(w.begin);
  const auto measured_from = Clock::now();
  const CpuTime coordinator_cpu0 = process_cpu(coordinator.pid());
  const CpuTime own_cpu0 = process_cpu(::getpid());
  std::this_thread::sleep_until(w.end);
  const CpuTime coordinator_cpu1 = process_cpu(coordinator.pid());
  const CpuTime own_cpu1 = process_cpu(::getpid());
  const double window_s = std::chrono::duration<double>(Clock::now() - measured_from).count();
  for (std::thread& t : workers) t.join();

  std::size_t welcomed = 0;
  Clock::time_point last_welcome = w.t0;
  for (const Agent& a : all) {
    if (!a.welcomed) continue;
    ++welcomed;
    last_welcome = std::max(last_welcome, a.welcomed_at);
  }

  const auto state = cluster_state(frontend);
  std::size_t alive = 0, known = 0;
  if (state) {
    known = static_cast<std::size_t>(state->nodes_size());
    for (const v1::NodeState& n : state->nodes()) alive += n.alive() ? 1 : 0;
  }

  std::uint64_t sent = 0, received = 0, invalid = 0, reregisters = 0, reregisters_in_window = 0;
  for (const auto& shard : shards) {
    sent += shard->sent_in_window;
    received += shard->received_in_window;
    invalid += shard->invalid;
  }
  std::uint64_t fewest = UINT64_MAX, most = 0;
  for (const Agent& a : all) {
    fewest = std::min(fewest, a.beats_in_window);
    most = std::max(most, a.beats_in_window);
    reregisters += a.reregisters;
    reregisters_in_window += a.reregisters_in_window;
  }
  const auto percent = [&](double cpu_seconds) { return 100 * cpu_seconds / window_s; };
  const double coordinator_pct = percent(coordinator_cpu1.total() - coordinator_cpu0.total());

  fmt::print(
      "{} of {} agents welcomed, the last {:.2f} s after the first registration (coordinator "
      "pid {}, {})\n",
      welcomed, agents, std::chrono::duration<double>(last_welcome - w.t0).count(),
      coordinator.pid(), *endpoint);
  fmt::print(
      "measured {:.1f} s after {} s of warm-up; {} threads / ZeroMQ contexts for the "
      "agents; agents' ZMTP heartbeats {}\n",
      window_s, warmup, threads, zmtp_ms > 0 ? fmt::format("every {} ms", zmtp_ms) : "off");
  fmt::print("heartbeats to the coordinator:   {} ({:.1f} messages/s)\n", sent,
             static_cast<double>(sent) / window_s);
  fmt::print("heartbeats from the coordinator: {} ({:.1f} messages/s); per agent {}..{}\n",
             received, static_cast<double>(received) / window_s, fewest, most);
  fmt::print(
      "re-registrations asked: {} ({} while measured); invalid messages: {}; 'declared "
      "dead' log lines: {}\n",
      reregisters, reregisters_in_window, invalid, coordinator.dead_lines());
  fmt::print("nodes alive at the end (frontend state): {} of {} known, {} agents\n", alive, known,
             agents);
  fmt::print("bench process CPU (the agents, for context): {:.1f} % of one core\n",
             percent(own_cpu1.total() - own_cpu0.total()));
  fmt::print("coordinator user {:.2f} %, system {:.2f} %\n",
             percent(coordinator_cpu1.user - coordinator_cpu0.user),
             percent(coordinator_cpu1.system - coordinator_cpu0.system));
  fmt::print("coordinator CPU: {:.2f} % of one core (target < 10 %)\n", coordinator_pct);

  coordinator.stop();
  const bool ok = welcomed == all.size() && state && alive == all.size() && known == all.size() &&
                  reregisters == 0 && invalid == 0 && coordinator.dead_lines() == 0 &&
                  fewest + 2 >= static_cast<std::uint64_t>(seconds);
  if (!ok) fmt::print(stderr, "FAILED: agents lost or starved of heartbeats (see above)\n");
  return ok ? 0 : 1;
}
