// thaw-driver-conformance: runs the emulator's documented-behaviour suites against a CUDA driver,
// each test in a fresh process, and lists every test that disagrees. See usage() below.
//
// Why a runner and a separate test binary: the tests link libcuda.so.1, so a binary holding them
// cannot even start where no libcuda.so.1 is found (a machine without NVIDIA's driver that should
// test thaw's emulator); this program links no CUDA at all. One process per test is what ctest
// gives the suites (each starts with an uninitialised driver), and on a real GPU it keeps a test
// that crashes, hangs or leaves a sticky error from taking the rest down with it.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "child.hpp"
#include "report.hpp"

namespace {

namespace fs = std::filesystem;
using namespace thaw::conformance;

constexpr const char* kSuites = "thaw-driver-conformance-suites";
// The cuda.h the suites were written against (CUDA_VERSION there; this program includes no CUDA).
constexpr int kBuiltFor = 13000;

void usage(std::FILE* to) {
  std::fprintf(to,
               R"(usage: thaw-driver-conformance [options] [--gtest_filter=PATTERN] [--gtest_...]

Runs the tests of thaw's CUDA driver emulator that pin documented driver behaviour (VMM, export
and import, cuGetProcAddress and PyTorch's required entry points, streams and events, capture and
graphs, module loading, memory, devices and contexts, error codes) against a libcuda.so.1. On the
emulator they all pass; on NVIDIA's driver every failed test names a place where the emulator
disagrees with the real driver. Checks of the emulator's own features (its inspection calls,
THAW_EMU_* settings, faults, timing, trace, host access to device pointers) are skipped there.

Each test runs in its own process, one after another (so memory figures are not disturbed).
The test kernels are sm_90 cubins: the driver under test should drive a Hopper GPU (the
emulator models an H100 SXM5; its exact figures are compared only on that model).

options:
  --json FILE       also write the results as JSON: {"libcuda", "driver_version", "emulator",
                    "counts", "failed": [names], "tests": [{"name", "result", "seconds",
                    "reason", "output"}]}; result is passed, skipped, failed, crashed, timeout
                    or not run; "failed" lists every test that did not pass or skip
  --timeout SEC     per test (default 300)
  --list            list the tests and exit
  --verbose         print every test's output, not only failures'
  --single-process  run the tests in one plain GoogleTest process instead (no isolation;
                    --json then gives GoogleTest's own JSON)
  --gtest_*         passed to the tests (--gtest_filter selects them)
  -h, --help        this text

environment:
  THAW_LIBCUDA=PATH  the libcuda.so.1 to test (NVIDIA's, or thaw's emulator). Honoured by
                     running the tests with LD_LIBRARY_PATH starting at a private directory that
                     holds a libcuda.so.1 link to PATH; the runner checks the tests loaded it.
                     Unset: whatever libcuda.so.1 the dynamic loader finds (the system driver).

files it needs next to itself (a kit directory):
  thaw-driver-conformance-suites  the tests (links libcuda.so.1)
  emu_peer                        peer process of the export/import tests
  libemu_kernels_twins.so         the test kernels' host twins (used on the emulator only)
  module-images/                  module images of the module-loading tests
The suites read THAW_EMU_PEER, THAW_EMU_KERNELS and THAW_MODULE_TESTDATA instead when set.

exit status: 0 every test passed or was skipped, 1 a test failed, 2 the tests could not run.
)");
}

struct Options {
  std::optional<std::string> json;
  std::chrono::seconds timeout{300};
  bool list = false;
  bool verbose = false;
  bool single_process = false;
  std::vector<std::string> gtest_args;  // for listing
  std::vector<std::string> child_args;  // for each test: without the filter
};

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (a == "--json") {
      o.json = value();
      if (!o.json) return std::nullopt;
    } else if (a == "--timeout") {
      auto v = value();
      if (!v || std::atoi(v->c_str()) <= 0) return std::nullopt;
      o.timeout = std::chrono::seconds(std::atoi(v->c_str()));
    } else if (a == "--list") {
      o.list = true;
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (a == "--single-process") {
      o.single_process = true;
    } else if (a.starts_with("--gtest_")) {
      o.gtest_args.push_back(a);
      if (!a.starts_with("--gtest_filter") && !a.starts_with("--gtest_output")) {
        o.child_args.push_back(a);
      }
    } else {
      std::fprintf(stderr, "thaw-driver-conformance: unknown argument '%s'\n", a.c_str());
      return std::nullopt;
    }
  }
  return o;
}

fs::path own_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : exe.parent_path();
}

// THAW_LIBCUDA: a private directory with libcuda.so.1 -> PATH, first on LD_LIBRARY_PATH (ahead
// of the suites' RUNPATH and the system's cache), inherited by every process the tests start.
// Removed at exit.
class LibcudaChoice {
 public:
  LibcudaChoice() = default;
  LibcudaChoice(const LibcudaChoice&) = delete;
  LibcudaChoice& operator=(const LibcudaChoice&) = delete;
  ~LibcudaChoice() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Returns an error message, or "" when done (or nothing was asked for).
  std::string apply() {
    const char* want = std::getenv("THAW_LIBCUDA");
    if (want == nullptr || *want == '\0') return "";
    std::error_code ec;
    target_ = fs::canonical(want, ec);
    if (ec || !fs::is_regular_file(target_)) return std::string("THAW_LIBCUDA: no file ") + want;
    std::string templ = (fs::temp_directory_path() / "thaw-conformance-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) return "mkdtemp: " + std::string(strerror(errno));
    dir_ = templ;
    fs::create_directory(dir_ / "lib", ec);
    fs::create_symlink(target_, dir_ / "lib" / "libcuda.so.1", ec);
    if (ec) return "cannot link " + target_.string() + ": " + ec.message();
    std::string path = (dir_ / "lib").string();
    if (const char* old = std::getenv("LD_LIBRARY_PATH"); old != nullptr && *old != '\0') {
      path += std::string(":") + old;
    }
    setenv("LD_LIBRARY_PATH", path.c_str(), 1);
    // The emulator's per-device ledgers: one private directory for this run's processes.
    fs::create_directory(dir_ / "emu-state", ec);
    setenv("THAW_EMU_STATE_DIR", (dir_ / "emu-state").c_str(), 0);
    return "";
  }
  const fs::path& target() const { return target_; }

 private:
  fs::path dir_;
  fs::path target_;
};

std::optional<DriverInfo> describe(const fs::path& suites, const LibcudaChoice& choice) {
  auto run = run_child({suites.string(), "--thaw-describe-driver"}, std::chrono::seconds(60));
  if (!run || run->exit_code != 0) {
    std::fprintf(stderr, "thaw-driver-conformance: the tests cannot start: %s%s",
                 run ? "\n" : run.error().c_str(), run ? run->output.c_str() : "\n");
    std::fprintf(stderr, "(set THAW_LIBCUDA to the libcuda.so.1 to test)\n");
    return std::nullopt;
  }
  DriverInfo d;
  std::istringstream in(run->output);
  std::string key, value;
  while (in >> key >> value) {
    if (key == "libcuda") d.libcuda = value;
    if (key == "version") d.version = std::atoi(value.c_str());
    if (key == "emulator") d.emulator = value == "yes";
  }
  if (!choice.target().empty() && d.libcuda != choice.target().string()) {
    std::fprintf(stderr, "thaw-driver-conformance: THAW_LIBCUDA names %s but the tests loaded %s\n",
                 choice.target().c_str(), d.libcuda.c_str());
    return std::nullopt;
  }
  return d;
}

// GoogleTest's --gtest_list_tests: "Suite.\n  Test  # GetParam() = ...\n".
std::optional<std::vector<std::string>> list_tests(const fs::path& suites, const Options& o) {
  std::vector<std::string> argv{suites.string(), "--gtest_list_tests"};
  argv.insert(argv.end(), o.gtest_args.begin(), o.gtest_args.end());
  auto run = run_child(argv, std::chrono::seconds(60));
  if (!run || run->exit_code != 0) {
    std::fprintf(stderr, "thaw-driver-conformance: cannot list the tests: %s\n",
                 run ? run->output.c_str() : run.error().c_str());
    return std::nullopt;
  }
  std::vector<std::string> names;
  std::istringstream in(run->output);
  std::string line, suite;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::string word = line.substr(0, line.find_first_of(" \t", line[0] == ' ' ? 2 : 0));
    if (line[0] != ' ') {
      suite = word;
    } else {
      names.push_back(suite + word.substr(2));
    }
  }
  return names;
}

void print_indented(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) std::printf("    %s\n", line.c_str());
}

int run_all(const fs::path& suites, const Options& o, const DriverInfo& driver,
            const std::vector<std::string>& names) {
  std::printf("[==========] %zu tests against %s (CUDA %d.%d, %s), one process each\n",
              names.size(), driver.libcuda.c_str(), driver.version / 1000,
              driver.version % 1000 / 10, driver.emulator ? "thaw's emulator" : "not the emulator");
  if (driver.version < kBuiltFor) {
    std::printf(
        "[ WARNING  ] the tests follow CUDA %d.%d's cuda.h and ask for its entry points; "
        "an older driver fails those for that reason alone\n",
        kBuiltFor / 1000, kBuiltFor % 1000 / 10);
  }
  std::vector<TestRecord> records;
  for (const auto& name : names) {
    std::printf("[ RUN      ] %s\n", name.c_str());
    std::fflush(stdout);
    std::vector<std::string> argv{suites.string(), "--gtest_filter=" + name};
    argv.insert(argv.end(), o.child_args.begin(), o.child_args.end());
    auto run = run_child(argv, o.timeout);
    if (!run) {
      std::fprintf(stderr, "thaw-driver-conformance: %s\n", run.error().c_str());
      return 2;
    }
    TestRecord t = classify(name, *run);
    const long ms = std::lround(t.seconds * 1000);
    if (o.verbose || is_failure(t.outcome)) print_indented(t.output);
    if (t.outcome == Outcome::kPassed) {
      std::printf("[       OK ] %s (%ld ms)\n", name.c_str(), ms);
    } else if (t.outcome == Outcome::kSkipped) {
      std::printf("[  SKIPPED ] %s (%ld ms): %s\n", name.c_str(), ms, t.reason.c_str());
    } else {
      std::printf("[  FAILED  ] %s (%ld ms): %s\n", name.c_str(), ms, outcome_name(t.outcome));
    }
    std::fflush(stdout);
    records.push_back(std::move(t));
  }
  int passed = 0, skipped = 0;
  std::vector<const TestRecord*> failed;
  for (const auto& t : records) {
    if (t.outcome == Outcome::kPassed) ++passed;
    if (t.outcome == Outcome::kSkipped) ++skipped;
    if (is_failure(t.outcome)) failed.push_back(&t);
  }
  std::printf("[==========] %zu tests ran.\n[  PASSED  ] %d tests.\n", records.size(), passed);
  if (skipped > 0) std::printf("[  SKIPPED ] %d tests.\n", skipped);
  if (!failed.empty()) {
    std::printf("[  FAILED  ] %zu tests, listed below:\n", failed.size());
    for (const auto* t : failed) {
      std::printf("[  FAILED  ] %s (%s)\n", t->name.c_str(), outcome_name(t->outcome));
    }
  }
  if (o.json) {
    if (auto w = write_json(*o.json, driver, records); !w) {
      std::fprintf(stderr, "thaw-driver-conformance: %s\n", w.error().c_str());
      return 2;
    }
  }
  if (records.empty()) return 2;
  return failed.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = parse(argc, argv);
  if (!options) {
    usage(stderr);
    return 2;
  }
  const fs::path suites = own_dir() / kSuites;
  if (access(suites.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "thaw-driver-conformance: %s is missing (it ships next to this program)\n",
                 suites.c_str());
    return 2;
  }
  LibcudaChoice choice;
  if (std::string err = choice.apply(); !err.empty()) {
    std::fprintf(stderr, "thaw-driver-conformance: %s\n", err.c_str());
    return 2;
  }
  auto driver = describe(suites, choice);
  if (!driver) return 2;
  if (options->single_process) {
    std::vector<std::string> args{suites.string()};
    args.insert(args.end(), options->gtest_args.begin(), options->gtest_args.end());
    if (options->json) args.push_back("--gtest_output=json:" + *options->json);
    auto run = run_child(args, std::chrono::hours(24));
    if (!run) return 2;
    std::fputs(run->output.c_str(), stdout);
    return run->exit_code == 0 ? 0 : 1;
  }
  auto names = list_tests(suites, *options);
  if (!names) return 2;
  if (options->list) {
    for (const auto& n : *names) std::printf("%s\n", n.c_str());
    return 0;
  }
  return run_all(suites, *options, *driver, *names);
}
