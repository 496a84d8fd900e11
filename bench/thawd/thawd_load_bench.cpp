// Load on a running thawd (issue 7): N shim-socket clients and M D-Bus property pollers
// for S seconds, every request timed; thawd's CPU from /proc/<pid>/stat before and after.
//
// Shim clients are closed-loop with a think time (--shim-interval-ms): connect, hello,
// then open_file requests alternating between two cached files (each reply carries two
// descriptors, which the client closes), reconnecting every --reconnect-every requests so
// accept, hello and the give-back on close are part of the load. D-Bus pollers GetAll the
// Manager, a model and a GPU object every --dbus-interval-ms, like monitoring agents.
//
// An error is any failed or unexpected reply; the bench exits 1 if there was one.
#include <fmt/format.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "common/proto/seqpacket.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Samples {
  std::mutex mutex;
  std::vector<double> latency_us;
  std::atomic<std::uint64_t> errors{0};
  std::string first_error;
  void add(std::vector<double>& local) {
    std::lock_guard lock(mutex);
    latency_us.insert(latency_us.end(), local.begin(), local.end());
  }
  void error(const std::string& what) {
    if (errors.fetch_add(1) == 0) {
      std::lock_guard lock(mutex);
      first_error = what;
    }
  }
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1));
  return v[i];
}

// utime + stime of a process, in seconds.
double cpu_seconds(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string s((std::istreambuf_iterator<char>(f)), {});
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

void shim_client(const std::string& socket, const std::string& model,
                 const std::vector<std::string>& files, std::chrono::milliseconds interval,
                 int reconnect_every, Clock::time_point end, Samples& samples) {
  std::vector<double> local;
  std::uint32_t id = 0;
  while (Clock::now() < end) {
    auto fd = thaw::proto::connect_seqpacket(socket);
    if (!fd) {
      samples.error(fd.error());
      std::this_thread::sleep_for(interval);
      continue;
    }
    auto exchange = [&](thaw::proto::Message m) -> std::optional<thaw::proto::Received> {
      m.request_id = ++id;
      const auto start = Clock::now();
      if (auto ok = thaw::proto::send_message(fd->get(), m); !ok) {
        samples.error(ok.error());
        return std::nullopt;
      }
      auto in = thaw::proto::receive_message(fd->get());
      if (!in) {
        samples.error(in.error().message);
        return std::nullopt;
      }
      local.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      return std::move(*in);
    };
    thaw::proto::Message hello;
    hello.type = thaw::proto::MessageType::hello;
    hello.body = {{"client", "thawd-load-bench"}, {"engine", "bench"}};
    auto h = exchange(hello);
    if (!h || h->message.type != thaw::proto::MessageType::hello_ok) {
      if (h) samples.error("hello: " + h->message.body.dump());
      continue;
    }
    for (int i = 0; i < reconnect_every && Clock::now() < end; ++i) {
      std::this_thread::sleep_for(interval);
      thaw::proto::Message open;
      open.type = thaw::proto::MessageType::open_file;
      open.body = {{"model", model}, {"path", files[static_cast<std::size_t>(i) % files.size()]}};
      auto r = exchange(open);
      if (!r) break;
      if (r->message.type != thaw::proto::MessageType::file || r->fds.size() != 2) {
        samples.error("open_file: " + r->message.body.dump());
      }
    }
  }
  samples.add(local);
}

void dbus_poller(const std::string& address,
                 const std::vector<std::pair<std::string, std::string>>& objects,
                 std::chrono::milliseconds interval, Clock::time_point end, Samples& samples) {
  std::vector<double> local;
  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r >= 0 && (r = sd_bus_set_address(bus, address.c_str())) >= 0 &&
      (r = sd_bus_set_bus_client(bus, 1)) >= 0) {
    r = sd_bus_start(bus);
  }
  if (r < 0) {
    samples.error(fmt::format("bus {}: {}", address, std::strerror(-r)));
    return;
  }
  std::size_t i = 0;
  while (Clock::now() < end) {
    std::this_thread::sleep_for(interval);
    const auto& [path, interface] = objects[i++ % objects.size()];
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message* reply = nullptr;
    const auto start = Clock::now();
    r = sd_bus_call_method(bus, "org.thaw.Node1", path.c_str(), "org.freedesktop.DBus.Properties",
                           "GetAll", &error, &reply, "s", interface.c_str());
    if (r < 0) {
      samples.error(
          fmt::format("GetAll {}: {}", path, error.message ? error.message : strerror(-r)));
    } else {
      local.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    sd_bus_error_free(&error);
    sd_bus_message_unref(reply);
  }
  sd_bus_flush_close_unref(bus);
  samples.add(local);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"thawd-load-bench: shim-socket clients and D-Bus pollers against a running thawd"};
  std::string socket, bus, model, model_path;
  std::vector<std::string> files;
  int thawd_pid = 0, shim_clients = 64, dbus_clients = 10, reconnect_every = 100;
  double seconds = 60;
  int shim_interval_ms = 10, dbus_interval_ms = 50;
  bool json = false;
  app.add_option("--socket", socket, "thawd's shim socket")->required();
  app.add_option("--bus", bus, "D-Bus address thawd is on")->required();
  app.add_option("--thawd-pid", thawd_pid, "for its CPU time")->required();
  app.add_option("--model", model, "a cached model's key")->required();
  app.add_option("--model-path", model_path, "its D-Bus object path")->required();
  app.add_option("--file", files, "cached files of it to open (repeat)")->required();
  app.add_option("--shim-clients", shim_clients);
  app.add_option("--dbus-clients", dbus_clients);
  app.add_option("--seconds", seconds);
  app.add_option("--shim-interval-ms", shim_interval_ms);
  app.add_option("--dbus-interval-ms", dbus_interval_ms);
  app.add_option("--reconnect-every", reconnect_every);
  app.add_flag("--json", json);
  CLI11_PARSE(app, argc, argv);

  Samples shim, dbus;
  const double cpu_before = cpu_seconds(thawd_pid);
  const auto start = Clock::now();
  const auto end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  for (int i = 0; i < shim_clients; ++i) {
    threads.emplace_back(shim_client, socket, model, files,
                         std::chrono::milliseconds(shim_interval_ms), reconnect_every, end,
                         std::ref(shim));
  }
  const std::vector<std::pair<std::string, std::string>> objects = {
      {"/org/thaw/Node1", "org.thaw.Node1.Manager"},
      {model_path, "org.thaw.Node1.Model"},
      {"/org/thaw/Node1/gpu/0", "org.thaw.Node1.Gpu"}};
  for (int i = 0; i < dbus_clients; ++i) {
    threads.emplace_back(dbus_poller, bus, objects, std::chrono::milliseconds(dbus_interval_ms),
                         end, std::ref(dbus));
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = cpu_seconds(thawd_pid) - cpu_before;

  nlohmann::json out = {{"seconds", wall},
                        {"thawd_cpu_seconds", cpu},
                        {"thawd_cpu_share_of_one_core", cpu / wall},
                        {"shim",
                         {{"clients", shim_clients},
                          {"requests", shim.latency_us.size()},
                          {"errors", shim.errors.load()},
                          {"p50_us", percentile(shim.latency_us, 50)},
                          {"p99_us", percentile(shim.latency_us, 99)},
                          {"max_us", percentile(shim.latency_us, 100)},
                          {"first_error", shim.first_error}}},
                        {"dbus",
                         {{"clients", dbus_clients},
                          {"requests", dbus.latency_us.size()},
                          {"errors", dbus.errors.load()},
                          {"p50_us", percentile(dbus.latency_us, 50)},
                          {"p99_us", percentile(dbus.latency_us, 99)},
                          {"max_us", percentile(dbus.latency_us, 100)},
                          {"first_error", dbus.first_error}}}};
  if (json) {
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("thawd load, {:.1f} s: thawd CPU {:.2f} s = {:.1f} % of one core\n", wall, cpu,
               100 * cpu / wall);
    for (const char* k : {"shim", "dbus"}) {
      const auto& s = out[k];
      fmt::print(
          "  {:<4} {:>3} clients: {:>8} requests, {} errors, latency p50 {:.0f} us, p99 {:.0f} us, "
          "max {:.0f} us\n",
          k, s["clients"].get<int>(), s["requests"].get<std::size_t>(),
          s["errors"].get<std::uint64_t>(), s["p50_us"].get<double>(), s["p99_us"].get<double>(),
          s["max_us"].get<double>());
      if (!s["first_error"].get<std::string>().empty()) {
        fmt::print("       first error: {}\n", s["first_error"].get<std::string>());
      }
    }
  }
  return shim.errors.load() + dbus.errors.load() == 0 ? 0 : 1;
}
