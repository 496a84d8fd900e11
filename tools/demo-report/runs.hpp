// The demo's runs, as tools/demo/run-demo.sh records them: one TSV line per run (id, label,
// timeline files, stdout files, run start, fetch end, engine start — wall-clock seconds, "-"
// where a run has no fetch), each engine run's phase timeline (refengine --timeline: one JSON
// object per event, seconds since its process started) and its tokens (refengine --json: one
// object per prompt on stdout). read_runs() turns them into one Run per line.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace thaw::demo {

// A bad input file: the message names the file and what is wrong with it.
struct ReportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An engine phase: its key in the JSON, its table heading, its colour in the picture and the
// timeline event that ends it. In order.
struct Phase {
  std::string_view key;
  std::string_view heading;
  std::string_view colour;
  std::string_view end_event;
};
inline constexpr std::array<Phase, 5> kPhases{{
    {"init", "engine init", "#8c8c8c", "allocator_ready"},
    {"weights", "weights", "#d62728", "weights_loaded"},
    {"profile_kv", "profile/KV", "#ff7f0e", "kv_cache_ready"},
    {"graphs", "graphs", "#9467bd", "graphs_captured"},
    {"first_token", "first token", "#2ca02c", "first_token"},
}};
inline constexpr std::string_view kFetchColour = "#1f77b4";

struct Run {
  std::string id;     // "a"
  std::string label;  // "cold: fetch, then start"
  int engine_runs = 0;
  std::optional<double> fetch_s;  // from the run's start; none: the run fetched nothing
  double engine_start_s = 0;      // from the run's start
  std::array<double, kPhases.size()> phase_s{};  // medians over the engine runs
  std::vector<double> weights_all_s;             // every engine run's weight phase
  double engine_to_first_token_s = 0;            // median
  double total_s = 0;                            // run start to the first token
  nlohmann::json tokens;                         // the first engine run's, one list per prompt
  bool tokens_all_runs_equal = false;
  std::optional<double> speedup;  // the first run's total / this one's
  bool tokens_equal_first = false;
  std::string device;  // the driver_init event's device name ("" when absent)
};

// Every run of RUNS.tsv, with speedup and tokens_equal_first against the first one.
std::vector<Run> read_runs(const std::string& tsv_path);

// The run as the JSON report stores it (keys in the order report.py wrote them).
nlohmann::ordered_json to_json(const Run& run);

// The value of KEY in the first EVENT of a timeline file, "" when there is none.
std::string timeline_field(const std::string& path, std::string_view event, std::string_view key);

}  // namespace thaw::demo
