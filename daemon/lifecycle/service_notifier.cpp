#include "daemon/lifecycle/service_notifier.hpp"

#include <systemd/sd-daemon.h>

#include <string>

namespace thaw::daemon {

namespace {

class SystemdNotifier final : public ServiceNotifier {
 public:
  void ready(std::string_view status) override { send("READY=1\nSTATUS=" + std::string(status)); }
  void status(std::string_view status) override { send("STATUS=" + std::string(status)); }
  void reloading() override { send("RELOADING=1\nSTATUS=reloading the configuration"); }
  void stopping(std::string_view status) override {
    send("STOPPING=1\nSTATUS=" + std::string(status));
  }

 private:
  // Failure to notify is not fatal: thawd keeps serving; systemd times out the start.
  static void send(const std::string& state) { (void)sd_notify(0, state.c_str()); }
};

}  // namespace

std::unique_ptr<ServiceNotifier> make_systemd_notifier() {
  return std::make_unique<SystemdNotifier>();
}

}  // namespace thaw::daemon
