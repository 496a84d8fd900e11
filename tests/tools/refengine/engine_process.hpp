// Runs the reference engine as a separate process, as a user would, on the emulator.
//
// The paths come from the suite's compile definitions (tests/tools/CMakeLists.txt):
// REFENGINE_BIN, REFENGINE_LINKED_BIN, REFENGINE_EMU_LIBCUDA (the emulator), REFENGINE_TWIN_LIB
// (the kernels' host twins) and REFENGINE_TEST_MODELS (synthetic models made by the
// refengine_models fixture). The engine inherits the test's THAW_EMU_STATE_DIR (a fresh one
// per test binary, emu_test_main.cpp), so processes of one test share the emulated GPU.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace refengine_test {

namespace fs = std::filesystem;

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct EngineRun {
  int exit_code = -1;  // the process's exit status; 128 + n when killed by signal n
  std::string out;     // stdout
  std::string err;     // stderr (the timeline unless --timeline)
};

// The small generate run the shim and thawd suites share: two prompts, 4 tokens each, a
// 32-token context, batches of 12 — then `extra`.
inline std::vector<std::string> small_generate_args(const fs::path& model,
                                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      "generate",  "--model",         model.string(), "--tokens",
      "1,2,3,4,5", "--tokens",        "9,8,7",        "--max-tokens",
      "4",         "--ignore-eos",    "--json",       "--max-num-seqs",
      "4",         "--max-model-len", "32",           "--max-num-batched-tokens",
      "12"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

inline std::string engine_env(const std::string& extra = {}) {
  // LD_LIBRARY_PATH: where the -lcuda variant finds libcuda.so.1 (the emulator).
  const std::string emu_dir = fs::path(REFENGINE_EMU_LIBCUDA).parent_path().string();
  std::string env = std::string("env REFENGINE_LIBCUDA=") + REFENGINE_EMU_LIBCUDA +
                    " LD_LIBRARY_PATH=" + emu_dir + " THAW_EMU_KERNELS=" + REFENGINE_TWIN_LIB +
                    " THAW_EMU_DEVICE_MEMORY=6G";
  if (!extra.empty()) env += " " + extra;
  return env;
}

// The shell command running `binary args...` with the emulator environment (+ `env_extra`,
// "VAR=value ...").
inline std::string engine_command(const std::vector<std::string>& args,
                                  const std::string& env_extra = {},
                                  const std::string& binary = REFENGINE_BIN) {
  std::string cmd = engine_env(env_extra) + " " + quote(binary);
  for (const auto& a : args) cmd += " " + quote(a);
  return cmd;
}

inline EngineRun run_engine(const std::vector<std::string>& args, const std::string& env_extra = {},
                            const std::string& binary = REFENGINE_BIN) {
  // Atomic: suites run several engines at once from threads, each needs its own directory.
  static std::atomic<int> counter{0};
  const fs::path dir = fs::temp_directory_path() / ("refengine_run_" + std::to_string(::getpid()) +
                                                    "_" + std::to_string(counter++));
  fs::create_directories(dir);
  const std::string cmd = engine_command(args, env_extra, binary) + " >" +
                          quote((dir / "out").string()) + " 2>" + quote((dir / "err").string());
  const int status = std::system(cmd.c_str());
  EngineRun r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = read_file(dir / "out");
  r.err = read_file(dir / "err");
  fs::remove_all(dir);
  return r;
}

// JSON lines of stdout (generate --json).
inline std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A TCP port that was free a moment ago (bind to port 0, read it back, close).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace refengine_test
