// A thawd on the emulator with a private bus and a loopback nginx registry serving the
// fetch suites' synthetic GPT-2 ("gpt-syn", 18 shards, 64 KiB chunks), for the end-to-end
// suites. The test directory is world-readable so that setpriv'd clients reach the bus.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fetch_test_support.hpp"
#include "nginx_server.hpp"
#include "temp_dir.hpp"
#include "thawd_test_support.hpp"

namespace thaw::testing {

class ThawdFixture : public ::testing::Test {
 protected:
  ThawdFixture() { ::chmod(dir_.path().c_str(), 0755); }
  ~ThawdFixture() override {
    if (pid_ > 0) kill_thawd();
  }

  void start_registry() {
    registry_ = std::make_unique<store::testing::RegistryFixture>();
    for (const std::string& f : store::testing::model_files(registry_->model_dir())) {
      model_bytes_ += std::filesystem::file_size(registry_->model_dir() / f);
    }
  }

  // Starts thawd (and the bus, the first time) and waits for READY=1.
  // `max_rate`: thawd's store.max_rate, to slow a fetch down enough to watch it.
  void start_thawd(BusPolicy policy, const std::string& max_rate = "") {
    if (!bus_) bus_ = std::make_unique<PrivateBus>(dir_.path(), policy);
    if (metrics_port_ == 0) metrics_port_ = store::testing::free_loopback_port();
    write_config(max_rate);
    std::filesystem::remove(dir_.path() / "notify");
    NotifySocket notify(dir_.path() / "notify");
    pid_ = spawn(
        {THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()},
        {"NOTIFY_SOCKET=" + (dir_.path() / "notify").string(), "THAW_LIBCUDA=" THAW_EMU_LIBCUDA,
         "THAW_EMU_DEVICE_MEMORY=256M", "THAW_EMU_STATE_DIR=" + emu_state_dir().string(),
         "no_proxy=127.0.0.1", "NO_PROXY=127.0.0.1"},
        dir_.path() / "thawd.log");
    const auto ready = notify.until("READY=1");
    ASSERT_FALSE(ready.empty()) << "thawd did not become ready:\n" << log();
  }

  // thawd.toml for the next start (or a SIGHUP reload of the running thawd).
  void write_config(const std::string& max_rate = "") {
    std::ofstream(dir_.path() / "thawd.toml")
        << "[node]\nstate_dir = \"" << (dir_.path() / "state").string() << "\"\n"
        << "[store]\ncache_dir = \"" << (dir_.path() / "cache").string()
        << "\"\ncache_budget = \"256MiB\"\nregistry = \""
        << (registry_ ? registry_->server().base_url() : "") << "\"\nmax_rate = \"" << max_rate
        << "\"\nconnections = 2\n[gpu]\npool_share = " << pool_share_ << "\n[shim]\nsocket = \""
        << socket_path().string() << "\"\n"
        << (allow_groups_.empty() ? "" : "allow_groups = " + allow_groups_ + "\n")
        << "[dbus]\nbus = \"" << bus_->address()
        << "\"\n[metrics]\nlisten = \"127.0.0.1:" << metrics_port_
        << "\"\n"
        // Never the test machine's real uplink: a root thawd with a NIC would shape it.
        << "[network]\nshaping = false\n";
  }

  int stop_thawd() {
    ::kill(pid_, SIGTERM);
    const int rc = wait_exit(pid_);
    pid_ = -1;
    return rc;
  }
  void kill_thawd() {
    ::kill(pid_, SIGKILL);
    wait_exit(pid_);
    pid_ = -1;
  }

  ProgramResult thawctl(std::vector<std::string> args) const {
    args.insert(args.begin(), {THAWCTL_PATH, "--bus=" + bus_->address()});
    return run(args);
  }
  std::string log() const { return slurp(dir_.path() / "thawd.log"); }
  // gpu.pool_share of the next start_thawd() (the tests' default leaves half to the driver).
  std::string pool_share_ = "0.5";
  // shim.allow_groups of the next write_config(), as TOML (e.g. ["thaw", "nogroup"]); "" =
  // thawd's default.
  std::string allow_groups_;
  std::uint64_t model_bytes() const { return model_bytes_; }
  std::string metrics_url() const {
    return "http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics";
  }
  std::filesystem::path socket_path() const { return dir_.path() / "thawd.sock"; }
  std::filesystem::path emu_state_dir() const { return dir_.path() / "emu"; }
  pid_t thawd_pid() const { return pid_; }

  TempDir dir_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<store::testing::RegistryFixture> registry_;
  std::uint64_t model_bytes_ = 0;
  std::uint16_t metrics_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace thaw::testing
