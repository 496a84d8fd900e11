// thawctl: the operator's CLI for thawd, over D-Bus like machinectl (org.thaw.Node1).
//
//   thawctl [--bus system|user|ADDRESS] [--json] status | gpus
//
// Exit codes: 0 done; 1 thawd could not be reached or refused (the message says why and
// what to check); 2 bad usage.
#include <fmt/format.h>
#include <systemd/sd-bus.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/text/byte_size.hpp"

namespace {

constexpr const char* kService = "org.thaw.Node1";
constexpr const char* kPath = "/org/thaw/Node1";
constexpr const char* kManager = "org.thaw.Node1.Manager";

struct BusUnref {
  void operator()(sd_bus* b) const { sd_bus_flush_close_unref(b); }
};
using Bus = std::unique_ptr<sd_bus, BusUnref>;

struct Failure {
  std::string message;
};

[[noreturn]] void fail(const std::string& message) {
  throw Failure{message};
}

Bus connect(const std::string& which) {
  sd_bus* bus = nullptr;
  int r = 0;
  if (which == "system") {
    r = sd_bus_open_system(&bus);
  } else if (which == "user") {
    r = sd_bus_open_user(&bus);
  } else if ((r = sd_bus_new(&bus)) >= 0) {
    if ((r = sd_bus_set_address(bus, which.c_str())) >= 0 &&
        (r = sd_bus_set_bus_client(bus, 1)) >= 0) {
      r = sd_bus_start(bus);
    }
    if (r < 0) sd_bus_unref(bus);
  }
  if (r < 0) {
    fail(fmt::format("cannot reach the {} bus: {}; is thawd running? (systemctl status thawd)",
                     which, std::strerror(-r)));
  }
  return Bus(bus);
}

std::string why(const sd_bus_error& e, int r) {
  return e.message != nullptr ? std::string(e.message) : std::string(std::strerror(-r));
}

std::string get_string(sd_bus* bus, const char* property) {
  sd_bus_error error = SD_BUS_ERROR_NULL;
  char* value = nullptr;
  const int r =
      sd_bus_get_property_string(bus, kService, kPath, kManager, property, &error, &value);
  if (r < 0) {
    std::string message = fmt::format(
        "reading {} from thawd: {}; is thawd running? (systemctl "
        "status thawd)",
        property, why(error, r));
    sd_bus_error_free(&error);
    fail(message);
  }
  std::string out(value);
  std::free(value);
  return out;
}

template <typename T>
T get_trivial(sd_bus* bus, const char* property, char type) {
  sd_bus_error error = SD_BUS_ERROR_NULL;
  T value{};
  const int r =
      sd_bus_get_property_trivial(bus, kService, kPath, kManager, property, &error, type, &value);
  if (r < 0) {
    std::string message = fmt::format("reading {} from thawd: {}", property, why(error, r));
    sd_bus_error_free(&error);
    fail(message);
  }
  return value;
}

int status(sd_bus* bus, bool json) {
  const std::string node = get_string(bus, "NodeId");
  const std::string version = get_string(bus, "Version");
  const std::string state = get_string(bus, "State");
  const auto used = get_trivial<uint64_t>(bus, "CacheBytesUsed", 't');
  const auto budget = get_trivial<uint64_t>(bus, "CacheBudgetBytes", 't');
  const auto gpus = get_trivial<uint32_t>(bus, "GpuCount", 'u');
  if (json) {
    fmt::print("{}\n", nlohmann::json{{"node_id", node},
                                      {"version", version},
                                      {"state", state},
                                      {"cache_bytes_used", used},
                                      {"cache_budget_bytes", budget},
                                      {"gpus", gpus}}
                           .dump());
    return 0;
  }
  fmt::print("node     {}\nthawd    {} ({})\ncache    {} of {}\nGPUs     {}\n", node, version,
             state, thaw::text::format_bytes(static_cast<double>(used)),
             thaw::text::format_bytes(static_cast<double>(budget)), gpus);
  return 0;
}

int gpus(sd_bus* bus, bool json) {
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* reply = nullptr;
  int r = sd_bus_call_method(bus, kService, kPath, kManager, "ListGpus", &error, &reply, "");
  if (r < 0) {
    std::string message = fmt::format("ListGpus: {}", why(error, r));
    sd_bus_error_free(&error);
    fail(message);
  }
  nlohmann::json out = nlohmann::json::array();
  r = sd_bus_message_enter_container(reply, 'a', "(uttu)");
  uint32_t index = 0, slots = 0;
  uint64_t pool = 0, free_bytes = 0;
  while (r >= 0 &&
         (r = sd_bus_message_read(reply, "(uttu)", &index, &pool, &free_bytes, &slots)) > 0) {
    out.push_back(
        {{"index", index}, {"pool_bytes", pool}, {"free_bytes", free_bytes}, {"slots", slots}});
  }
  sd_bus_message_unref(reply);
  if (r < 0) fail(fmt::format("ListGpus: malformed reply: {}", std::strerror(-r)));
  if (json) {
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("{:<4} {:>12} {:>12} {:>6}\n", "GPU", "POOL", "FREE", "SLOTS");
  for (const auto& g : out) {
    fmt::print("{:<4} {:>12} {:>12} {:>6}\n", g["index"].get<uint32_t>(),
               thaw::text::format_bytes(g["pool_bytes"].get<double>()),
               thaw::text::format_bytes(g["free_bytes"].get<double>()), g["slots"].get<uint32_t>());
  }
  if (out.empty()) fmt::print("(no GPUs: thawd runs the model store only)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"thawctl: look at and steer thawd, the thaw node daemon (over D-Bus)"};
  const char* env_bus = std::getenv("THAW_BUS");
  std::string bus = env_bus != nullptr ? env_bus : "system";
  bool json = false;
  app.add_option("--bus", bus, "system, user, or a D-Bus address (default: $THAW_BUS or system)");
  app.add_flag("--json", json, "print JSON for scripts");
  app.require_subcommand(1);
  auto* status_cmd = app.add_subcommand("status", "node id, version, state, cache use, GPUs");
  auto* gpus_cmd = app.add_subcommand("gpus", "each GPU's pool: size, free, prewarm slots");
  app.footer("Exit codes: 0 done, 1 thawd unreachable or refused (see the message), 2 bad usage.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    Bus connection = connect(bus);
    if (status_cmd->parsed()) return status(connection.get(), json);
    if (gpus_cmd->parsed()) return gpus(connection.get(), json);
  } catch (const Failure& f) {
    fmt::print(stderr, "thawctl: {}\n", f.message);
    return 1;
  }
  return 2;
}
