#include "commands.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <thread>

#include "common/text/byte_size.hpp"

namespace thawctl {

namespace {

using thaw::text::format_bytes;
using thaw::text::format_duration;
using namespace std::chrono_literals;

std::string bytes(const nlohmann::json& v) {
  return format_bytes(v.get<double>());
}

// Reads an array reply of `signature` elements, each turned into JSON by `read_one`.
template <typename ReadOne>
nlohmann::json read_array(sd_bus_message* reply, const char* element, ReadOne read_one) {
  nlohmann::json out = nlohmann::json::array();
  int r = sd_bus_message_enter_container(reply, 'a', element);
  while (r >= 0 && (r = read_one(reply, out)) > 0) {
  }
  if (r < 0) fail(fmt::format("malformed reply from thawd: {}", std::strerror(-r)));
  return out;
}

std::string path_of(sd_bus_message* reply) {
  const char* path = nullptr;
  if (sd_bus_message_read(reply, "o", &path) < 0) fail("malformed reply from thawd");
  return path;
}

// Follows an object until `done(props)` says so, drawing `line(props)` on stderr (in place
// on a terminal, every few seconds otherwise). Returns the last properties.
template <typename Done, typename Line>
nlohmann::json follow(sd_bus* bus, const std::string& path, const char* interface, double timeout_s,
                      bool quiet, Done done, Line line) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  const auto start = std::chrono::steady_clock::now();
  auto next_line = start;
  for (;;) {
    nlohmann::json p = get_all(bus, path, interface);
    const auto now = std::chrono::steady_clock::now();
    const bool finished = done(p);
    if (!quiet && (finished || now >= next_line)) {
      if (tty) {
        fmt::print(stderr, "\r\033[K{}{}", line(p), finished ? "\n" : "");
      } else {
        fmt::print(stderr, "{}\n", line(p));
      }
      next_line = now + (tty ? 200ms : 5s);
    }
    if (finished) return p;
    if (timeout_s > 0 && now - start > std::chrono::duration<double>(timeout_s)) {
      if (tty && !quiet) fmt::print(stderr, "\n");
      fail(fmt::format("{} not done after {} s", path, timeout_s), kExitTimeout);
    }
    std::this_thread::sleep_for(100ms);
  }
}

// A Model object's properties as thawctl prints them with --json: snake_case, as every
// other command's JSON (the bus's names are CamelCase).
nlohmann::json model_json(const nlohmann::json& p) {
  return {{"key", p.value("Key", std::string())},
          {"name", p.value("Name", std::string())},
          {"state", p.value("State", std::string())},
          {"integrity", p.value("Integrity", std::string("verified"))},
          {"fetched_bytes", p.value("FetchedBytes", std::uint64_t{0})},
          {"total_bytes", p.value("TotalBytes", std::uint64_t{0})},
          {"rate_bytes_per_s", p.value("Rate", 0.0)},
          {"files", p.value("Files", std::uint32_t{0})},
          {"error", p.value("Error", std::string())}};
}

nlohmann::json slot_json(const nlohmann::json& p) {
  return {{"id", p.value("Id", std::string())},
          {"gpu", p.value("Gpu", std::uint32_t{0})},
          {"model", p.value("Model", std::string())},
          {"state", p.value("State", std::string())},
          {"resident_bytes", p.value("ResidentBytes", std::uint64_t{0})},
          {"total_bytes", p.value("TotalBytes", std::uint64_t{0})},
          {"owner", p.value("Owner", std::string())},
          {"layout", p.value("Layout", std::string())},
          {"error", p.value("Error", std::string())}};
}

// "[#########...........]  45 %  1.2 GiB of 2.7 GiB  310 MiB/s  ETA 5 s", or "resolving…"
// while the total is not known yet (the fetch is listing the model or reading headers).
std::string transfer_text(double done, double total, double rate) {
  if (total <= 0) return "resolving…";
  constexpr int kWidth = 24;
  const double share = std::clamp(done / total, 0.0, 1.0);
  const int filled = static_cast<int>(share * kWidth);
  std::string text = fmt::format("[{}{}] {:3.0f} %  {} of {}", std::string(filled, '#'),
                                 std::string(kWidth - filled, '.'), 100.0 * share,
                                 format_bytes(done), format_bytes(total));
  if (rate > 0) {
    text += fmt::format("  {}/s", format_bytes(rate));
    if (done < total) text += fmt::format("  ETA {}", format_duration((total - done) / rate));
  }
  return text;
}

std::string model_line(const nlohmann::json& p) {
  const std::string state = p["State"].get<std::string>();
  if (state != "fetching") {
    return fmt::format("{} {} {}", p["Key"].get<std::string>(), state,
                       format_bytes(p["FetchedBytes"].get<double>()));
  }
  return fmt::format("{} {}", p["Key"].get<std::string>(),
                     transfer_text(p["FetchedBytes"].get<double>(), p["TotalBytes"].get<double>(),
                                   p["Rate"].get<double>()));
}

int finish_model(const nlohmann::json& p, const Options& o) {
  if (o.json) fmt::print("{}\n", model_json(p).dump());
  if (p["State"] == "complete") {
    if (!o.json && p.value("Integrity", std::string()) == "unverified") {
      fmt::print(stderr,
                 "thawctl: warning: {} is unverified: it was published without "
                 "thaw-manifest.json, so its bytes were not checked (store.allow_unverified)\n",
                 p["Key"].get<std::string>());
    }
    return kExitOk;
  }
  fmt::print(stderr, "thawctl: fetching {} failed: {}\n", p["Key"].get<std::string>(),
             p["Error"].get<std::string>());
  return kExitFailed;
}

bool model_settled(const nlohmann::json& p) {
  return p["State"] == "complete" || p["State"] == "failed" || p["State"] == "partial";
}

}  // namespace

int status(sd_bus* bus, const Options& o) {
  const nlohmann::json p = get_all(bus, kManagerPath, kManager);
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"node_id", p["NodeId"]},
                                      {"version", p["Version"]},
                                      {"state", p["State"]},
                                      {"cache_bytes_used", p["CacheBytesUsed"]},
                                      {"cache_budget_bytes", p["CacheBudgetBytes"]},
                                      {"gpus", p["GpuCount"]},
                                      {"prewarm_hits", p.value("PrewarmHits", 0)},
                                      {"prewarm_misses", p.value("PrewarmMisses", 0)},
                                      {"engine_layout_hits", p.value("EngineLayoutHits", 0)},
                                      {"handbacks", p.value("Handbacks", 0)}}
                           .dump());
    return kExitOk;
  }
  fmt::print("node     {}\nthawd    {} ({})\ncache    {} of {}\nGPUs     {}\n",
             p["NodeId"].get<std::string>(), p["Version"].get<std::string>(),
             p["State"].get<std::string>(), bytes(p["CacheBytesUsed"]),
             bytes(p["CacheBudgetBytes"]), p["GpuCount"].get<uint32_t>());
  fmt::print(
      "engines  {} attached to a prewarmed slot ({} in their engine layout), {} found none; "
      "{} slots handed back\n",
      p.value("PrewarmHits", 0), p.value("EngineLayoutHits", 0), p.value("PrewarmMisses", 0),
      p.value("Handbacks", 0));
  return kExitOk;
}

int gpus(sd_bus* bus, const Options& o) {
  Reply reply = call(bus, "ListGpus", {});
  const nlohmann::json out =
      read_array(reply.get(), "(uttu)", [](sd_bus_message* m, nlohmann::json& out) {
        uint32_t index = 0, slots = 0;
        uint64_t pool = 0, free_bytes = 0;
        const int r = sd_bus_message_read(m, "(uttu)", &index, &pool, &free_bytes, &slots);
        if (r > 0) {
          out.push_back({{"index", index},
                         {"pool_bytes", pool},
                         {"free_bytes", free_bytes},
                         {"slots", slots}});
        }
        return r;
      });
  if (o.json) {
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  fmt::print("{:<4} {:>12} {:>12} {:>6}\n", "GPU", "POOL", "FREE", "SLOTS");
  for (const auto& g : out) {
    fmt::print("{:<4} {:>12} {:>12} {:>6}\n", g["index"].get<uint32_t>(), bytes(g["pool_bytes"]),
               bytes(g["free_bytes"]), g["slots"].get<uint32_t>());
  }
  if (out.empty()) fmt::print("(no GPUs: thawd runs the model store only)\n");
  return kExitOk;
}

int slots(sd_bus* bus, const Options& o) {
  Reply reply = call(bus, "ListSlots", {});
  const nlohmann::json out =
      read_array(reply.get(), "(susstto)", [](sd_bus_message* m, nlohmann::json& out) {
        const char *id = nullptr, *model = nullptr, *state = nullptr, *path = nullptr;
        uint32_t gpu = 0;
        uint64_t resident = 0, total = 0;
        const int r = sd_bus_message_read(m, "(susstto)", &id, &gpu, &model, &state, &resident,
                                          &total, &path);
        if (r > 0) {
          out.push_back({{"id", id},
                         {"gpu", gpu},
                         {"model", model},
                         {"state", state},
                         {"resident_bytes", resident},
                         {"total_bytes", total},
                         {"path", path}});
        }
        return r;
      });
  // Which layout each slot holds, and which engine holds it: from the slot objects.
  nlohmann::json slots = nlohmann::json::array();
  for (nlohmann::json s : out) {
    auto p = get_all_if_present(bus, s["path"].get<std::string>(), "org.thaw.Node1.Slot");
    if (!p) continue;  // evicted since ListSlots
    s["layout"] = p->value("Layout", std::string());
    s["owner"] = p->value("Owner", std::string());
    slots.push_back(std::move(s));
  }
  if (o.json) {
    fmt::print("{}\n", slots.dump());
    return kExitOk;
  }
  fmt::print("{:<8} {:<4} {:<32} {:<10} {:<7} {:>12} {:>12} {}\n", "SLOT", "GPU", "MODEL", "STATE",
             "LAYOUT", "RESIDENT", "TOTAL", "OWNER");
  for (const auto& s : slots) {
    fmt::print("{:<8} {:<4} {:<32} {:<10} {:<7} {:>12} {:>12} {}\n", s["id"].get<std::string>(),
               s["gpu"].get<uint32_t>(), s["model"].get<std::string>(),
               s["state"].get<std::string>(), s["layout"].get<std::string>(),
               bytes(s["resident_bytes"]), bytes(s["total_bytes"]), s["owner"].get<std::string>());
  }
  if (slots.empty()) fmt::print("(no prewarm slots: thawctl prewarm MODEL makes one)\n");
  return kExitOk;
}

// ListModels as JSON: key, name, state, fetched_bytes, total_bytes, path.
nlohmann::json list_models(sd_bus* bus) {
  Reply reply = call(bus, "ListModels", {});
  return read_array(reply.get(), "(ssstto)", [](sd_bus_message* m, nlohmann::json& out) {
    const char *key = nullptr, *name = nullptr, *state = nullptr, *path = nullptr;
    uint64_t fetched = 0, total = 0;
    const int r = sd_bus_message_read(m, "(ssstto)", &key, &name, &state, &fetched, &total, &path);
    if (r > 0) {
      out.push_back({{"key", key},
                     {"name", name},
                     {"state", state},
                     {"fetched_bytes", fetched},
                     {"total_bytes", total},
                     {"path", path}});
    }
    return r;
  });
}

int models(sd_bus* bus, const Options& o) {
  nlohmann::json out = nlohmann::json::array();
  // Whether each was verified: from the model objects (ListModels predates it).
  for (auto& m : list_models(bus)) {
    auto p = get_all_if_present(bus, m["path"].get<std::string>(), "org.thaw.Node1.Model");
    if (!p) continue;  // evicted since ListModels
    m["integrity"] = p->value("Integrity", std::string("verified"));
    out.push_back(std::move(m));
  }
  if (o.json) {
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  fmt::print("{:<40} {:<10} {:<10} {:>12} {:>12}\n", "MODEL", "STATE", "INTEGRITY", "FETCHED",
             "SIZE");
  bool unverified = false;
  for (const auto& m : out) {
    unverified = unverified || m["integrity"] == "unverified";
    fmt::print("{:<40} {:<10} {:<10} {:>12} {:>12}\n", m["key"].get<std::string>(),
               m["state"].get<std::string>(), m["integrity"].get<std::string>(),
               bytes(m["fetched_bytes"]), bytes(m["total_bytes"]));
  }
  if (out.empty()) fmt::print("(nothing cached: thawctl fetch MODEL)\n");
  if (unverified) {
    fmt::print(
        "(unverified: published without thaw-manifest.json, so nothing checked the "
        "bytes; re-publish with thaw-fetch publish)\n");
  }
  return kExitOk;
}

int fetch(sd_bus* bus, const std::string& model, const Options& o) {
  Reply reply = call(bus, "Fetch", [&](sd_bus_message* m) {
    return sd_bus_message_append(m, "s", model.c_str());
  });
  const std::string path = path_of(reply.get());
  if (!o.wait) {
    if (o.json) fmt::print("{}\n", nlohmann::json{{"path", path}}.dump());
    return kExitOk;
  }
  const nlohmann::json p =
      follow(bus, path, "org.thaw.Node1.Model", o.timeout_s, o.json, model_settled, model_line);
  return finish_model(p, o);
}

int wait_model(sd_bus* bus, const std::string& model, const Options& o) {
  std::string path;
  for (const auto& m : list_models(bus)) {
    if (m["key"] == model || m["name"] == model) path = m["path"];
  }
  if (path.empty()) {
    fail(fmt::format("thawd knows no model {} (fetch it: thawctl fetch {})", model, model));
  }
  const nlohmann::json p =
      follow(bus, path, "org.thaw.Node1.Model", o.timeout_s, o.json, model_settled, model_line);
  return finish_model(p, o);
}

int prewarm(sd_bus* bus, const std::string& model, const Options& o) {
  const auto gpu = static_cast<int32_t>(o.gpu.value_or(-1));
  Reply reply = o.layers ? call(bus, "PrewarmLayers",
                                [&](sd_bus_message* m) {
                                  return sd_bus_message_append(m, "sii", model.c_str(), gpu,
                                                               static_cast<int32_t>(*o.layers));
                                })
                         : call(bus, "Prewarm", [&](sd_bus_message* m) {
                             return sd_bus_message_append(m, "si", model.c_str(), gpu);
                           });
  const std::string path = path_of(reply.get());
  if (!o.wait) {
    if (o.json) fmt::print("{}\n", nlohmann::json{{"path", path}}.dump());
    return kExitOk;
  }
  const nlohmann::json p = follow(
      bus, path, "org.thaw.Node1.Slot", o.timeout_s, o.json,
      [](const nlohmann::json& s) { return s["State"] != "loading" && s["State"] != "empty"; },
      [](const nlohmann::json& s) {
        return fmt::format("{} {} {} {} of {}", s["Id"].get<std::string>(),
                           s["Model"].get<std::string>(), s["State"].get<std::string>(),
                           bytes(s["ResidentBytes"]), bytes(s["TotalBytes"]));
      });
  if (o.json) fmt::print("{}\n", slot_json(p).dump());
  if (p["State"] == "failed") {
    fmt::print(stderr, "thawctl: prewarming {} failed: {}\n", model, p["Error"].get<std::string>());
    return kExitFailed;
  }
  if (!o.json) fmt::print("{}\n", p["Id"].get<std::string>());
  return kExitOk;
}

int slot_action(sd_bus* bus, const char* method, const std::string& slot, const Options& o) {
  (void)call(bus, method, [&](sd_bus_message* m) {
    if (std::string_view(method) == "Activate") {
      return sd_bus_message_append(m, "st", slot.c_str(), static_cast<uint64_t>(o.kv_bytes));
    }
    return sd_bus_message_append(m, "s", slot.c_str());
  });
  if (o.json) {
    std::string action(method);
    std::ranges::transform(action, action.begin(), [](unsigned char c) { return std::tolower(c); });
    fmt::print("{}\n", nlohmann::json{{"slot", slot}, {"done", action}}.dump());
  }
  return kExitOk;
}

namespace {

constexpr std::uint32_t kNoOwner = 0xffffffffu;  // ListArtifacts: a record without an owner

nlohmann::json list_artifacts(sd_bus* bus, const std::string& model) {
  Reply reply = call(bus, "ListArtifacts", [&](sd_bus_message* m) {
    return sd_bus_message_append(m, "s", model.c_str());
  });
  return read_array(reply.get(), "(ssssssuttbs)", [](sd_bus_message* m, nlohmann::json& out) {
    const char *key = nullptr, *kind = nullptr, *model = nullptr, *engine = nullptr, *gpu = nullptr,
               *driver = nullptr, *summary = nullptr;
    uint32_t owner = 0;
    uint64_t bytes = 0, modified_usec = 0;
    int readable = 0;
    const int r = sd_bus_message_read(m, "(ssssssuttbs)", &key, &kind, &model, &engine, &gpu,
                                      &driver, &owner, &bytes, &modified_usec, &readable, &summary);
    if (r > 0) {
      out.push_back({{"key", key},
                     {"kind", kind},
                     {"model", model},
                     {"engine", engine},
                     {"gpu", gpu},
                     {"driver", driver},
                     {"owner", owner == kNoOwner ? nlohmann::json() : nlohmann::json(owner)},
                     {"bytes", bytes},
                     {"modified_usec", modified_usec},
                     {"readable", readable != 0},
                     {"summary", summary}});
    }
    return r;
  });
}

// "2026-11-27 02:53:07", local time.
std::string local_time(std::uint64_t usec) {
  const std::time_t t = static_cast<std::time_t>(usec / 1'000'000);
  std::tm tm{};
  if (::localtime_r(&t, &tm) == nullptr) return "-";
  char text[32];
  return std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &tm) > 0 ? text : "-";
}

// The engine fingerprint's program ("/usr/bin/python3 4096 17..." → "python3").
std::string program_of(const std::string& engine) {
  std::string program = engine.substr(0, engine.find(' '));
  if (const auto slash = program.rfind('/'); slash != std::string::npos) {
    program = program.substr(slash + 1);
  }
  return program.empty() ? "-" : program;
}

}  // namespace

int artifacts(sd_bus* bus, const std::string& model, const Options& o) {
  nlohmann::json out = list_artifacts(bus, model);
  if (out.empty() && !model.empty()) {
    // Records name the model by its cache key: a registry name is looked up.
    for (const auto& m : list_models(bus)) {
      if (m["name"] == model && m["key"] != model) {
        out = list_artifacts(bus, m["key"].get<std::string>());
        break;
      }
    }
  }
  if (o.json) {
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  fmt::print("{:<32} {:<8} {:<12} {:<6} {:<24} {:<8} {:>10} {:<19} {}\n", "MODEL", "KIND", "ENGINE",
             "OWNER", "GPU", "DRIVER", "SIZE", "USED", "SUMMARY");
  bool unreadable = false;
  for (const auto& a : out) {
    const bool ok = a["readable"].get<bool>();
    unreadable = unreadable || !ok;
    const std::string model_text = a["model"].get<std::string>();
    fmt::print("{:<32} {:<8} {:<12} {:<6} {:<24} {:<8} {:>10} {:<19} {}{}\n",
               model_text.empty() ? "?" : model_text, a["kind"].get<std::string>(),
               program_of(a["engine"].get<std::string>()),
               a["owner"].is_null() ? std::string("-") : a["owner"].dump(),
               a["gpu"].get<std::string>(), a["driver"].get<std::string>(), bytes(a["bytes"]),
               local_time(a["modified_usec"].get<std::uint64_t>()),
               ok ? "" : "unreadable: ", a["summary"].get<std::string>());
  }
  if (out.empty()) {
    fmt::print("{}\n", model.empty() ? "(no artifacts: engines record them on their first run "
                                       "under the shim)"
                                     : "(no artifacts of this model)");
  }
  if (unreadable) {
    fmt::print(
        "(unreadable records are not used: remove KEY.json from the artifacts directory of "
        "thawd's node.state_dir (thawctl --json artifacts names each KEY); engines record new "
        "ones)\n");
  }
  return kExitOk;
}

}  // namespace thawctl
