// Shared set-up for the vmm suites: the emulated driver loaded as thaw loads any driver
// (common/cuda, $THAW_LIBCUDA), small synthetic models from thaw-genmodel, and the
// emulator's inspection entry points for exact leak checks.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cuda/driver.hpp"
#include "temp_dir.hpp"
#include "thaw/emu_inspect.h"

namespace thaw::vmm::testing {

namespace fs = std::filesystem;

inline std::shared_ptr<const cuda::Driver> load_driver() {
  auto driver = cuda::Driver::load();
  if (!driver) throw std::runtime_error(driver.error().what());
  return *driver;
}

inline ThawEmuDeviceStats device_stats(const cuda::Driver& driver, int device = 0) {
  using Fn = int (*)(int, ThawEmuDeviceStats*);
  auto fn = reinterpret_cast<Fn>(driver.symbol("thawEmuGetDeviceStats"));
  if (fn == nullptr) throw std::runtime_error("the driver is not thaw's emulator");
  ThawEmuDeviceStats stats{};
  if (fn(device, &stats) != 0) throw std::runtime_error("thawEmuGetDeviceStats failed");
  return stats;
}

inline ThawEmuProcessStats process_stats(const cuda::Driver& driver) {
  using Fn = int (*)(ThawEmuProcessStats*);
  auto fn = reinterpret_cast<Fn>(driver.symbol("thawEmuGetProcessStats"));
  if (fn == nullptr) throw std::runtime_error("the driver is not thaw's emulator");
  ThawEmuProcessStats stats{};
  if (fn(&stats) != 0) throw std::runtime_error("thawEmuGetProcessStats failed");
  return stats;
}

// Runs argv, waits, returns the exit status (-1 if it did not exit normally).
inline int run_program(const std::vector<std::string>& argv) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A small GPT-2 checkpoint (real HF layout) in `dir`: `layers` blocks of width `embd`.
inline void generate_model(const fs::path& dir, int layers = 4, int embd = 256,
                           const std::string& shard_size = "1MB") {
  const int rc =
      run_program({THAW_GENMODEL_PATH, "--size", "custom", "--layers", std::to_string(layers),
                   "--embd", std::to_string(embd), "--heads", "4", "--vocab", "1000",
                   "--shard-size", shard_size, "--quiet", "--out", dir.string()});
  if (rc != 0) throw std::runtime_error("thaw-genmodel exited with " + std::to_string(rc));
}

using thaw::testing::TempDir;

inline std::vector<std::byte> read_range(const fs::path& path, std::uint64_t offset,
                                         std::uint64_t length) {
  std::vector<std::byte> out(length);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(length));
  if (!in) throw std::runtime_error("short read of " + path.string());
  return out;
}

}  // namespace thaw::vmm::testing
