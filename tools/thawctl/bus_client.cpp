#include "bus_client.hpp"

#include <fmt/format.h>

#include <cstring>
#include <functional>

namespace thawctl {

void fail(std::string message, int exit_code) {
  throw Failure{std::move(message), exit_code, {}};
}

namespace {

std::string why(const sd_bus_error& e, int r) {
  return e.message != nullptr ? std::string(e.message) : std::string(std::strerror(-r));
}

[[noreturn]] void fail_call(const std::string& what, sd_bus_error& error, int r) {
  Failure f{fmt::format("{}: {}", what, why(error, r)), kExitThawd,
            error.name != nullptr ? error.name : ""};
  if (f.error_name == SD_BUS_ERROR_SERVICE_UNKNOWN ||
      f.error_name == SD_BUS_ERROR_NAME_HAS_NO_OWNER) {
    f.message += "; is thawd running? (systemctl status thawd)";
  }
  sd_bus_error_free(&error);
  throw f;
}

}  // namespace

// GetAll; nullopt only when `may_be_gone` and the object does not exist.
std::optional<nlohmann::json> read_all(sd_bus* bus, const std::string& path, const char* interface,
                                       bool may_be_gone);

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

nlohmann::json get_all(sd_bus* bus, const std::string& path, const char* interface) {
  return read_all(bus, path, interface, false).value();
}

std::optional<nlohmann::json> get_all_if_present(sd_bus* bus, const std::string& path,
                                                 const char* interface) {
  return read_all(bus, path, interface, true);
}

std::optional<nlohmann::json> read_all(sd_bus* bus, const std::string& path, const char* interface,
                                       bool may_be_gone) {
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* raw = nullptr;
  int r = sd_bus_call_method(bus, kService, path.c_str(), "org.freedesktop.DBus.Properties",
                             "GetAll", &error, &raw, "s", interface);
  if (r < 0 && may_be_gone && sd_bus_error_has_name(&error, SD_BUS_ERROR_UNKNOWN_OBJECT)) {
    sd_bus_error_free(&error);
    return std::nullopt;
  }
  if (r < 0) fail_call(fmt::format("reading {}", path), error, r);
  Reply reply(raw);
  nlohmann::json out = nlohmann::json::object();
  if ((r = sd_bus_message_enter_container(raw, 'a', "{sv}")) < 0) {
    fail(fmt::format("reading {}: malformed reply", path));
  }
  while ((r = sd_bus_message_enter_container(raw, 'e', "sv")) > 0) {
    const char* name = nullptr;
    const char* contents = nullptr;
    char type = 0;
    if (sd_bus_message_read(raw, "s", &name) < 0 ||
        sd_bus_message_peek_type(raw, &type, &contents) < 0 ||
        sd_bus_message_enter_container(raw, 'v', contents) < 0) {
      fail(fmt::format("reading {}: malformed reply", path));
    }
    const char sig = contents[0];
    if (sig == 's') {
      const char* v = nullptr;
      sd_bus_message_read(raw, "s", &v);
      out[name] = v;
    } else if (sig == 't') {
      uint64_t v = 0;
      sd_bus_message_read(raw, "t", &v);
      out[name] = v;
    } else if (sig == 'u') {
      uint32_t v = 0;
      sd_bus_message_read(raw, "u", &v);
      out[name] = v;
    } else if (sig == 'd') {
      double v = 0;
      sd_bus_message_read(raw, "d", &v);
      out[name] = v;
    } else {
      sd_bus_message_skip(raw, contents);
    }
    sd_bus_message_exit_container(raw);  // v
    sd_bus_message_exit_container(raw);  // e
  }
  return out;
}

Reply call(sd_bus* bus, const char* method, const std::function<int(sd_bus_message*)>& fill) {
  sd_bus_message* m = nullptr;
  int r = sd_bus_message_new_method_call(bus, &m, kService, kManagerPath, kManager, method);
  if (r < 0) fail(fmt::format("{}: {}", method, std::strerror(-r)));
  Reply request(m);
  if (fill && (r = fill(m)) < 0) fail(fmt::format("{}: {}", method, std::strerror(-r)));
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* raw = nullptr;
  // Long enough for a Prewarm that waits for a GPU lock; thawd never blocks long.
  r = sd_bus_call(bus, m, 60'000'000, &error, &raw);
  if (r < 0) fail_call(method, error, r);
  return Reply(raw);
}

}  // namespace thawctl
