#include "report.hpp"

#include <signal.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace thaw::conformance {

namespace {

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  s.erase(s.find_last_not_of(ws) + 1);
  return s;
}

std::string first_lines(const std::string& text, std::size_t n) {
  std::size_t end = 0;
  for (std::size_t i = 0; i < n; ++i) {
    end = text.find('\n', end);
    if (end == std::string::npos) return text;
    ++end;
  }
  return text.substr(0, end);
}

// What GoogleTest printed after the line holding `marker` ("file:line: Skipped") and before
// `end`, at most `max_lines` lines of it.
std::string message_after(const std::string& out, const std::string& marker, const std::string& end,
                          std::size_t max_lines) {
  std::size_t at = out.find(marker);
  if (at == std::string::npos) return "";
  std::size_t from = out.find('\n', at);
  if (from == std::string::npos) return "";
  ++from;
  std::size_t to = out.find(end, from);
  return trim(first_lines(out.substr(from, to == std::string::npos ? to : to - from), max_lines));
}

}  // namespace

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPassed:
      return "passed";
    case Outcome::kSkipped:
      return "skipped";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kCrashed:
      return "crashed";
    case Outcome::kTimedOut:
      return "timeout";
    case Outcome::kNotRun:
      return "not run";
  }
  return "?";
}

TestRecord classify(const std::string& name, const ChildResult& run) {
  TestRecord t;
  t.name = name;
  t.seconds = run.elapsed.count();
  t.output = run.output;
  const std::string& out = run.output;
  if (run.timed_out) {
    t.outcome = Outcome::kTimedOut;
    t.reason = "no result within the time limit; killed";
  } else if (run.signal != 0) {
    t.outcome = Outcome::kCrashed;
    t.reason = std::string("the test's process died of signal ") + std::to_string(run.signal) +
               " (" + strsignal(run.signal) + ")";
  } else if (run.exit_code != 0) {
    t.outcome = Outcome::kFailed;
    t.reason = message_after(out, ": Failure", "[  FAILED  ]", 6);
    if (t.reason.empty()) t.reason = "exit status " + std::to_string(run.exit_code);
  } else if (out.find("[  SKIPPED ] " + name) != std::string::npos) {
    t.outcome = Outcome::kSkipped;
    t.reason = message_after(out, ": Skipped", "[  SKIPPED ]", 6);
  } else if (out.find("[       OK ] " + name) != std::string::npos) {
    t.outcome = Outcome::kPassed;
  } else {
    t.outcome = Outcome::kNotRun;
    t.reason = "the test's process exited 0 without running it";
  }
  return t;
}

std::expected<void, std::string> write_json(const std::string& path, const DriverInfo& driver,
                                            const std::vector<TestRecord>& tests) {
  nlohmann::ordered_json j;
  j["program"] = "thaw-driver-conformance";
  j["libcuda"] = driver.libcuda;
  j["driver_version"] = driver.version;
  j["emulator"] = driver.emulator;
  int passed = 0, skipped = 0, failed = 0;
  nlohmann::ordered_json failed_names = nlohmann::ordered_json::array();
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& t : tests) {
    if (t.outcome == Outcome::kPassed) ++passed;
    if (t.outcome == Outcome::kSkipped) ++skipped;
    nlohmann::ordered_json e;
    e["name"] = t.name;
    e["result"] = outcome_name(t.outcome);
    e["seconds"] = t.seconds;
    if (!t.reason.empty()) e["reason"] = t.reason;
    if (is_failure(t.outcome)) {
      ++failed;
      failed_names.push_back(t.name);
      e["output"] = t.output;
    }
    list.push_back(std::move(e));
  }
  j["counts"] = {
      {"total", tests.size()}, {"passed", passed}, {"skipped", skipped}, {"failed", failed}};
  j["failed"] = std::move(failed_names);
  j["tests"] = std::move(list);
  std::ofstream f(path);
  // Output may hold any bytes a test printed: replace invalid UTF-8 rather than throw.
  f << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  if (!f) return std::unexpected("cannot write " + path);
  return {};
}

}  // namespace thaw::conformance
