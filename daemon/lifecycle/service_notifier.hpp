// ServiceNotifier: thawd's side of systemd's Type=notify protocol (sd_notify), behind a
// narrow interface so the life cycle can be tested without systemd.
//
// READY=1 once thawd serves, STATUS= as things change (what `systemctl status thawd`
// shows), STOPPING=1 when it starts to shut down. WATCHDOG=1 pings are sent by the event
// loop itself (sd_event_set_watchdog) when systemd set WATCHDOG_USEC.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace thaw::daemon {

class ServiceNotifier {
 public:
  virtual ~ServiceNotifier() = default;
  virtual void ready(std::string_view status) = 0;
  virtual void status(std::string_view status) = 0;
  virtual void reloading() = 0;  // RELOADING=1 (a READY=1 follows when the reload is done)
  virtual void stopping(std::string_view status) = 0;
};

// sd_notify() to $NOTIFY_SOCKET; does nothing when thawd was not started by systemd.
std::unique_ptr<ServiceNotifier> make_systemd_notifier();

}  // namespace thaw::daemon
