#include "runs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>

namespace thaw::demo {

namespace {

using json = nlohmann::json;

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  for (;;) {
    auto at = s.find(sep);
    out.emplace_back(s.substr(0, at));
    if (at == std::string_view::npos) return out;
    s.remove_prefix(at + 1);
  }
}

std::ifstream open_or_throw(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ReportError(fmt::format("cannot open {}", path));
  return in;
}

// Each non-empty line of a JSON-lines file, parsed; a bad line names the file and line.
template <typename Fn>
void for_each_json_line(const std::string& path, Fn&& fn) {
  auto in = open_or_throw(path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      throw ReportError(fmt::format("{}:{}: not a JSON object", path, n));
    }
    fn(j);
  }
}

// Seconds since the engine's process start of each event's first occurrence.
std::map<std::string, double, std::less<>> load_timeline(const std::string& path) {
  std::map<std::string, double, std::less<>> events;
  for_each_json_line(path, [&](const json& e) {
    if (!e.contains("event") || !e.contains("since_start_ms")) {
      throw ReportError(fmt::format("{}: an event without event or since_start_ms", path));
    }
    events.emplace(e["event"].get<std::string>(), e["since_start_ms"].get<double>() / 1000.0);
  });
  return events;
}

json load_tokens(const std::string& path) {
  json out = json::array();
  for_each_json_line(path, [&](const json& o) {
    if (!o.contains("tokens")) throw ReportError(fmt::format("{}: a line without tokens", path));
    out.push_back(o["tokens"]);
  });
  return out;
}

// Durations of kPhases from one timeline; a phase whose event is absent (graphs in eager mode)
// lasts 0 and the next phase starts where the previous one ended.
std::array<double, kPhases.size()> phases_of(const std::map<std::string, double, std::less<>>& ev,
                                             const std::string& path) {
  std::string missing;
  for (std::string_view e :
       {"allocator_ready", "weights_loaded", "kv_cache_ready", "first_token"}) {
    if (!ev.contains(e)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", e);
  }
  if (!missing.empty()) {
    throw ReportError(
        fmt::format("{}: timeline lacks {} (did the engine run fail?)", path, missing));
  }
  std::array<double, kPhases.size()> out{};
  double prev = 0;
  for (size_t i = 0; i < kPhases.size(); ++i) {
    auto it = ev.find(kPhases[i].end_event);
    double end = it == ev.end() ? prev : it->second;
    out[i] = std::max(0.0, end - prev);
    prev = std::max(prev, end);
  }
  return out;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  size_t n = xs.size();
  return n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

double to_seconds(const std::string& s, const std::string& what, const std::string& tsv) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw ReportError(fmt::format("{}: {} '{}' is not a number of seconds", tsv, what, s));
}

Run read_run(const std::vector<std::string>& f, const std::string& tsv) {
  Run r;
  r.id = f[0];
  r.label = f[1];
  double start = to_seconds(f[4], "run start", tsv);
  r.engine_start_s = to_seconds(f[6], "engine start", tsv) - start;
  if (f[5] != "-") r.fetch_s = to_seconds(f[5], "fetch end", tsv) - start;
  // Several engine runs (--repeat): each phase's median; every run's tokens count.
  auto timelines = split(f[2], ',');
  auto outs = split(f[3], ',');
  std::vector<std::array<double, kPhases.size()>> phases;
  std::vector<double> first_token;
  for (const auto& t : timelines) {
    auto ev = load_timeline(t);
    phases.push_back(phases_of(ev, t));
    first_token.push_back(ev.find("first_token")->second);
  }
  r.device = timeline_field(timelines[0], "driver_init", "device");
  r.engine_runs = static_cast<int>(timelines.size());
  for (size_t i = 0; i < kPhases.size(); ++i) {
    std::vector<double> xs;
    for (const auto& p : phases) xs.push_back(p[i]);
    r.phase_s[i] = median(xs);
  }
  for (const auto& p : phases) r.weights_all_s.push_back(p[1]);
  r.engine_to_first_token_s = median(first_token);
  r.total_s = r.engine_start_s + r.engine_to_first_token_s;
  r.tokens_all_runs_equal = true;
  for (size_t i = 0; i < outs.size(); ++i) {
    json tokens = load_tokens(outs[i]);
    if (i == 0) {
      r.tokens = std::move(tokens);
    } else if (tokens != r.tokens) {
      r.tokens_all_runs_equal = false;
    }
  }
  return r;
}

}  // namespace

std::string timeline_field(const std::string& path, std::string_view event, std::string_view key) {
  std::string out;
  bool found = false;
  for_each_json_line(path, [&](const json& e) {
    if (found || e.value("event", std::string()) != event) return;
    found = true;
    auto it = e.find(key);
    if (it != e.end()) out = it->is_string() ? it->get<std::string>() : it->dump();
  });
  return out;
}

std::vector<Run> read_runs(const std::string& tsv_path) {
  auto in = open_or_throw(tsv_path);
  std::vector<Run> runs;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    auto fields = split(line, '\t');
    if (fields.size() < 7) {
      throw ReportError(
          fmt::format("{}:{}: {} fields, want 7 (id, label, timelines, outputs, "
                      "run start, fetch end, engine start)",
                      tsv_path, n, fields.size()));
    }
    runs.push_back(read_run(fields, tsv_path));
  }
  if (runs.empty()) throw ReportError(fmt::format("{}: no runs", tsv_path));
  const Run& base = runs.front();
  double base_total = base.total_s;
  json base_tokens = base.tokens;
  for (auto& r : runs) {
    if (r.total_s > 0) r.speedup = base_total / r.total_s;
    r.tokens_equal_first = r.tokens == base_tokens && r.tokens_all_runs_equal;
  }
  return runs;
}

nlohmann::ordered_json to_json(const Run& r) {
  nlohmann::ordered_json j;
  j["id"] = r.id;
  j["label"] = r.label;
  j["engine_runs"] = r.engine_runs;
  j["fetch_s"] = r.fetch_s ? nlohmann::ordered_json(*r.fetch_s) : nullptr;
  j["engine_start_s"] = r.engine_start_s;
  for (size_t i = 0; i < kPhases.size(); ++i) {
    j[fmt::format("{}_s", kPhases[i].key)] = r.phase_s[i];
  }
  j["weights_all_s"] = r.weights_all_s;
  j["engine_to_first_token_s"] = r.engine_to_first_token_s;
  j["total_s"] = r.total_s;
  j["tokens"] = r.tokens;
  j["tokens_all_runs_equal"] = r.tokens_all_runs_equal;
  j["device"] = r.device;
  j["speedup"] = r.speedup ? nlohmann::ordered_json(*r.speedup) : nullptr;
  j["tokens_equal_first"] = r.tokens_equal_first;
  return j;
}

}  // namespace thaw::demo
