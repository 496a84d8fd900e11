#include "commands.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/text/byte_size.hpp"

namespace thawctl {

namespace {

using thaw::text::format_bytes;
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

std::string model_line(const nlohmann::json& p) {
  const double total = p["TotalBytes"].get<double>();
  const double done = p["FetchedBytes"].get<double>();
  return fmt::format("{} {} {} of {} ({:.0f} %) {}/s", p["Key"].get<std::string>(),
                     p["State"].get<std::string>(), format_bytes(done), format_bytes(total),
                     total > 0 ? 100.0 * done / total : 0.0, format_bytes(p["Rate"].get<double>()));
}

int finish_model(const nlohmann::json& p, const Options& o) {
  if (o.json) fmt::print("{}\n", p.dump());
  if (p["State"] == "complete") return kExitOk;
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
  nlohmann::json slots = out;
  for (auto& s : slots) {
    const nlohmann::json p = get_all(bus, s["path"].get<std::string>(), "org.thaw.Node1.Slot");
    s["layout"] = p.value("Layout", std::string());
    s["owner"] = p.value("Owner", std::string());
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
  if (out.empty()) fmt::print("(no prewarm slots: thawctl prewarm MODEL makes one)\n");
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
  const nlohmann::json out = list_models(bus);
  if (o.json) {
    fmt::print("{}\n", out.dump());
    return kExitOk;
  }
  fmt::print("{:<40} {:<10} {:>12} {:>12}\n", "MODEL", "STATE", "FETCHED", "SIZE");
  for (const auto& m : out) {
    fmt::print("{:<40} {:<10} {:>12} {:>12}\n", m["key"].get<std::string>(),
               m["state"].get<std::string>(), bytes(m["fetched_bytes"]), bytes(m["total_bytes"]));
  }
  if (out.empty()) fmt::print("(nothing cached: thawctl fetch MODEL)\n");
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
  if (o.json) fmt::print("{}\n", p.dump());
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
  if (o.json) fmt::print("{}\n", nlohmann::json{{"slot", slot}, {"done", method}}.dump());
  return kExitOk;
}

}  // namespace thawctl
