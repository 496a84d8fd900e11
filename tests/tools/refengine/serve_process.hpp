// `refengine serve` processes for the suites that talk HTTP to them (KV migration, streaming):
// one worker, or a PP=n pipeline of them, on the emulator's devices, each on its own port.
#pragma once

#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "engine_process.hpp"

namespace refengine_test {

inline const fs::path kModel = fs::path(REFENGINE_TEST_MODELS) / "gpt2-mini-f16";  // 4 layers
inline constexpr int kDevices = 6;

// free_port(), never one this test process handed out before: a pipeline's peer ports are
// chosen before its HTTP ports, and nothing holds them in between.
inline int unique_port() {
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard lock(mu);
  for (;;) {
    const int p = free_port();
    if (p != 0 && given.insert(p).second) return p;
  }
}

// One `refengine serve` process; SIGKILLed with the test process (PR_SET_PDEATHSIG).
class Serve {
 public:
  Serve(std::vector<std::string> extra, int device) : port_(unique_port()) {
    static std::atomic<int> n{0};
    log_ = fs::temp_directory_path() /
           ("refengine_kv_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".log");
    std::vector<std::string> args = {"serve",
                                     "--model",
                                     kModel.string(),
                                     "--max-num-seqs",
                                     "4",
                                     "--max-model-len",
                                     "128",
                                     "--num-gpu-blocks-override",
                                     "64",
                                     "--port",
                                     std::to_string(port_),
                                     "--device",
                                     std::to_string(device)};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string cmd = "exec " +
                            engine_command(args, "THAW_EMU_DEVICES=" + std::to_string(kDevices)) +
                            " >" + quote(log_.string()) + " 2>&1";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Serve() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      if (wait_exit(10000) < 0) {
        ::kill(pid_, SIGKILL);
        (void)wait_exit(10000);
      }
    }
    fs::remove(log_);
  }
  Serve(const Serve&) = delete;
  Serve& operator=(const Serve&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  std::string log() const { return read_file(log_); }
  bool ready(int timeout_s = 120) {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(std::chrono::milliseconds(200));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (auto r = c.Get("/health"); r && r->status == 200) return true;
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
    (void)wait_exit(10000);
  }
  void terminate() { ::kill(pid_, SIGTERM); }
  // The exit status (128 + n for signal n), -1 if still running after timeout_ms.
  int wait_exit(int timeout_ms) {
    if (pid_ <= 0) return exit_;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exit_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pid_ = -1;
        return exit_;
      }
      if (std::chrono::steady_clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  int port_;
  pid_t pid_ = -1;
  int exit_ = -1;
  fs::path log_;
};

// A PP=n pipeline: stage k on device k.
struct Pipeline {
  std::vector<std::unique_ptr<Serve>> stages;
  Pipeline(int n, std::vector<std::string> stage0_extra = {}) {
    std::string peers;
    for (int k = 0; k < n; ++k)
      peers += (k ? "," : "") + std::string("127.0.0.1:") + std::to_string(unique_port());
    for (int k = n - 1; k >= 0; --k) {
      std::vector<std::string> a = {"--pp-size",       std::to_string(n), "--pp-rank",
                                    std::to_string(k), "--pp-peers",      peers};
      if (k == 0) a.insert(a.end(), stage0_extra.begin(), stage0_extra.end());
      stages.insert(stages.begin(), std::make_unique<Serve>(a, k));
    }
  }
  bool ready() {
    for (auto& s : stages)
      if (!s->ready()) return false;
    return true;
  }
  std::string logs() const {
    std::string out;
    for (std::size_t k = 0; k < stages.size(); ++k)
      out += "--- stage " + std::to_string(k) + "\n" + stages[k]->log();
    return out;
  }
  std::vector<std::string> urls() const {
    std::vector<std::string> u;
    for (auto& s : stages) u.push_back(s->url());
    return u;
  }
};

}  // namespace refengine_test
