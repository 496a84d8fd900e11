// A caller whose process is not the one it connected as: it connects to the bus, then
// replaces its supplementary groups (setgroups, so it needs CAP_SETGID) and calls
// org.thaw.Node1.Manager.Fetch. thawd must judge it by what the bus recorded at connect time;
// credentials read from /proc at call time (SD_BUS_CREDS_AUGMENT) would show the new groups.
//
// Usage: call_after_setgroups ADDRESS GID MODEL
// Prints the call's result or its D-Bus error name and message; exits 0 when the call
// succeeded, 1 when thawd refused or failed it, 2 when the test could not be set up.
#include <grp.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ADDRESS GID MODEL\n", argv[0]);
    return 2;
  }
  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r >= 0) r = sd_bus_set_address(bus, argv[1]);
  if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
  if (r >= 0) r = sd_bus_start(bus);
  // Hello is answered before the groups change, so the bus has certainly taken its record.
  const char* unique = nullptr;
  if (r >= 0) r = sd_bus_get_unique_name(bus, &unique);
  if (r < 0) {
    std::fprintf(stderr, "connecting to %s: %s\n", argv[1], std::strerror(-r));
    return 2;
  }
  const gid_t group = static_cast<gid_t>(std::strtoul(argv[2], nullptr, 10));
  if (::setgroups(1, &group) != 0) {
    std::fprintf(stderr, "setgroups(%u): %s (run it with CAP_SETGID)\n", group,
                 std::strerror(errno));
    return 2;
  }
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* reply = nullptr;
  r = sd_bus_call_method(bus, "org.thaw.Node1", "/org/thaw/Node1", "org.thaw.Node1.Manager",
                         "Fetch", &error, &reply, "s", argv[3]);
  if (r < 0) {
    std::printf("%s: %s: %s\n", unique, error.name, error.message);
    sd_bus_error_free(&error);
    sd_bus_flush_close_unref(bus);
    return 1;
  }
  const char* path = nullptr;
  (void)sd_bus_message_read(reply, "o", &path);
  std::printf("%s: Fetch returned %s\n", unique, path != nullptr ? path : "?");
  sd_bus_message_unref(reply);
  sd_bus_flush_close_unref(bus);
  return 0;
}
