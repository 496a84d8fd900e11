// thaw-demo-report: the report of tools/demo/run-demo.sh (the table, its JSON copy and the
// timeline picture) and the small JSON look-ups the script needs, so that the demo runs where
// there is no python3 — a minimal Debian root, the real-GPU kit (issue 21).
//
//   report RUNS.tsv [--json FILE] [--svg FILE] [--title T] [--note N]... [--meta K=V]...
//   get PATH [--default TEXT]        a value of the JSON document on stdin (thawctl --json)
//   event TIMELINE EVENT KEY         a field of an engine timeline's first EVENT
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "render.hpp"
#include "runs.hpp"

namespace {

using thaw::demo::ReportError;
using ojson = nlohmann::ordered_json;

// --meta KEY=TEXT stores a string, KEY:=JSON a JSON value (a number, true, ...), as httpie does.
ojson parse_meta(const std::vector<std::string>& items) {
  ojson meta = ojson::object();
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ReportError(fmt::format("--meta '{}': want KEY=TEXT or KEY:=JSON", item));
    }
    if (item[eq - 1] == ':') {
      ojson v = ojson::parse(item.substr(eq + 1), nullptr, false);
      if (v.is_discarded()) {
        throw ReportError(
            fmt::format("--meta '{}': the value after := is not JSON (for text, "
                        "use KEY=TEXT)",
                        item));
      }
      meta[item.substr(0, eq - 1)] = std::move(v);
    } else {
      meta[item.substr(0, eq)] = item.substr(eq + 1);
    }
  }
  return meta;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw ReportError(fmt::format("cannot write {}", path));
}

struct ReportArgs {
  std::string runs, json_out, svg_out;
  std::string title = "thaw: four ways to the first token";
  std::vector<std::string> notes, meta;
};

int report(const ReportArgs& a) {
  ojson meta = parse_meta(a.meta);
  auto runs = thaw::demo::read_runs(a.runs);
  fmt::print("{}\n", thaw::demo::table(runs));
  if (!a.json_out.empty()) {
    ojson doc;
    doc["meta"] = std::move(meta);
    doc["notes"] = a.notes;
    doc["svg"] = a.svg_out.empty() ? ojson(nullptr) : ojson(a.svg_out);
    doc["runs"] = ojson::array();
    for (const auto& r : runs) doc["runs"].push_back(thaw::demo::to_json(r));
    write_file(a.json_out, doc.dump(1) + "\n");
  }
  if (!a.svg_out.empty()) write_file(a.svg_out, thaw::demo::svg(runs, a.title, a.notes));
  return 0;
}

// PATH: keys and array indexes joined by '.', '*' for every element ("0.state", "*.path").
// Prints each value found on its own line: a string as is, anything else as JSON.
int get(const std::string& path, const std::optional<std::string>& fallback) {
  std::string text(std::istreambuf_iterator<char>(std::cin), {});
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) throw ReportError("stdin is not a JSON document");
  std::vector<const nlohmann::json*> at{&doc};
  std::string_view rest = path;
  while (!rest.empty()) {
    auto dot = rest.find('.');
    std::string part(rest.substr(0, dot));
    rest = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
    std::vector<const nlohmann::json*> next;
    for (const auto* j : at) {
      if (part == "*" && j->is_array()) {
        for (const auto& e : *j) next.push_back(&e);
      } else if (j->is_array() && !part.empty() &&
                 part.find_first_not_of("0123456789") == std::string::npos) {
        if (size_t i = std::stoul(part); i < j->size()) next.push_back(&(*j)[i]);
      } else if (j->is_object() && j->contains(part)) {
        next.push_back(&(*j)[part]);
      }
    }
    at = std::move(next);
  }
  if (at.empty()) {
    if (!fallback) throw ReportError(fmt::format("no '{}' in the JSON on stdin", path));
    fmt::print("{}\n", *fallback);
    return 0;
  }
  for (const auto* j : at) fmt::print("{}\n", j->is_string() ? j->get<std::string>() : j->dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "thaw-demo-report: the table, JSON and timeline picture of tools/demo/run-demo.sh, and\n"
      "the JSON look-ups that script needs (it needs no python3)."};
  app.require_subcommand(1);

  ReportArgs ra;
  auto* rep = app.add_subcommand(
      "report",
      "print the table of RUNS.tsv (the lines run-demo.sh records: id, label, timelines, engine\n"
      "outputs, run start, fetch end, engine start); write its JSON and SVG");
  rep->add_option("runs", ra.runs, "RUNS.tsv")->required();
  rep->add_option("--json", ra.json_out, "write {meta, notes, svg, runs: [...]} to FILE");
  rep->add_option("--svg", ra.svg_out, "write the timeline picture to FILE");
  rep->add_option("--title", ra.title, "the picture's title");
  rep->add_option("--note", ra.notes, "a line under the picture (and in the JSON's notes)");
  rep->add_option("--meta", ra.meta, "KEY=TEXT or KEY:=JSON, stored in the JSON's meta");

  std::string path;
  std::optional<std::string> fallback;
  auto* g = app.add_subcommand(
      "get", "print a value of the JSON on stdin, e.g. thawctl --json slots | ... get 0.state");
  g->add_option("path", path, "keys and indexes joined by '.', '*' for each element")->required();
  g->add_option("--default", fallback, "print this when PATH is absent (else exit 1)");

  std::string timeline, event, key;
  auto* ev = app.add_subcommand("event", "print KEY of the first EVENT in an engine timeline");
  ev->add_option("timeline", timeline, "refengine --timeline FILE")->required();
  ev->add_option("event", event, "e.g. driver_init")->required();
  ev->add_option("key", key, "e.g. device")->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*rep) return report(ra);
    if (*g) return get(path, fallback);
    fmt::print("{}\n", thaw::demo::timeline_field(timeline, event, key));
    return 0;
  } catch (const ReportError& e) {
    fmt::print(stderr, "thaw-demo-report: {}\n", e.what());
  } catch (const nlohmann::json::exception& e) {
    fmt::print(stderr, "thaw-demo-report: unexpected JSON: {}\n", e.what());
  }
  return 1;
}
