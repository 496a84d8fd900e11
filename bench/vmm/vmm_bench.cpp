// Issue 6 benchmarks, each against a baseline in the same run:
//   0. the host -> device copy rate itself: one large cuMemcpyHtoDAsync from pinned memory
//      (cuMemHostAlloc) and one from the model's mmap'ed file pages (what the loaders read),
//      median of 3 each;
//   1. prewarm throughput (pages mapped on the host while earlier copies run) vs a naive
//      loader that creates and maps every page first, then copies; both as a share of the
//      PCIe rate: the configured one (THAW_EMU_PCIE_GBPS) on the emulator with its timing
//      model, the measured pinned rate of 0. on a real driver;
//   2. activation of the prewarmed large model: time on the caller's thread, and the driver
//      calls the emulator's trace (THAW_EMU_TRACE) shows on that thread meanwhile (none may
//      be a cuMemCreate or cuMemMap; thaw makes none at all); without a trace, not checked;
//   3. switching the GPU from model A (active, all free memory as KV) to prewarmed model B,
//      until B can serve (weights usable, first KV page mapped), vs a cold load of B the
//      way an engine does it (cuMemAlloc, one H2D copy per tensor, then its KV cache).
// Whether the driver is thaw's emulator is told by its thawEmuGetDeviceStats symbol.
// Run it through bench/vmm/run.sh, which builds the models and sets the emulator up;
// --help lists the options.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda/driver.hpp"
#include "common/safetensors/model.hpp"
#include "vmm/gpu_memory.hpp"

namespace {

using namespace thaw;
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kMiB = 1 << 20;

[[noreturn]] void die(const std::string& message) {
  fmt::print(stderr, "vmm_bench: {}\n", message);
  std::exit(1);
}

template <typename T>
T must(std::expected<T, vmm::VmmError> r, std::string_view what) {
  if (!r) die(fmt::format("{}: {}", what, r.error().message));
  return std::move(*r);
}
void must(std::expected<void, vmm::VmmError> r, std::string_view what) {
  if (!r) die(fmt::format("{}: {}", what, r.error().message));
}
template <typename T>
T must(std::expected<T, cuda::CudaError> r, std::string_view what) {
  if (!r) die(fmt::format("{}: {}", what, r.error().what()));
  return std::move(*r);
}
void must(std::expected<void, cuda::CudaError> r, std::string_view what) {
  if (!r) die(fmt::format("{}: {}", what, r.error().what()));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::int64_t steady_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

vmm::WeightLayout packed_layout(const std::string& dir) {
  auto model = safetensors::Model::open(dir);
  if (!model) die(fmt::format("{}: {}", dir, model.error().message));
  return must(vmm::WeightLayout::packed(*model), "packed layout");
}

// The naive loader: create and map every page of the weights, then copy.
double naive_prewarm(const cuda::Driver& d, CUdevice dev, const vmm::WeightLayout& layout,
                     vmm::WeightSource& source, CUstream stream) {
  const CUmemAllocationProp prop = cuda::device_allocation_prop(dev);
  const std::size_t page = must(d.allocation_granularity(prop), "granularity");
  const std::size_t pages = (layout.extent() + page - 1) / page;
  const auto t0 = Clock::now();
  const CUdeviceptr base = must(d.address_reserve(pages * page, page), "reserve");
  std::vector<CUmemGenericAllocationHandle> handles;
  for (std::size_t i = 0; i < pages; ++i) {
    handles.push_back(must(d.mem_create(page, prop), "cuMemCreate"));
    must(d.mem_map(base + i * page, page, 0, handles.back()), "cuMemMap");
    must(d.mem_set_access(base + i * page, page, dev), "cuMemSetAccess");
  }
  for (const vmm::LayoutPiece& p : layout.pieces()) {
    const std::byte* src = must(source.wait_bytes(p.file, p.file_offset, p.bytes), "source");
    must(d.memcpy_htod_async(base + p.slot_offset, src, p.bytes, stream), "copy");
  }
  must(d.stream_synchronize(stream), "sync");
  const double s = seconds_since(t0);
  for (std::size_t i = 0; i < pages; ++i) (void)d.mem_unmap(base + i * page, page);
  for (auto h : handles) (void)d.mem_release(h);
  (void)d.address_free(base, pages * page);
  return s;
}

// An engine's cold load: allocate, one H2D copy per tensor, synchronize, allocate KV.
double cold_load(const cuda::Driver& d, const vmm::WeightLayout& layout, vmm::WeightSource& source,
                 CUstream stream, std::uint64_t kv_bytes) {
  const auto t0 = Clock::now();
  const CUdeviceptr weights = must(d.mem_alloc(layout.extent()), "cuMemAlloc weights");
  for (const vmm::LayoutPiece& p : layout.pieces()) {
    const std::byte* src = must(source.wait_bytes(p.file, p.file_offset, p.bytes), "source");
    must(d.memcpy_htod_async(weights + p.slot_offset, src, p.bytes, stream), "copy");
  }
  must(d.stream_synchronize(stream), "sync");
  const CUdeviceptr kv = must(d.mem_alloc(kv_bytes), "cuMemAlloc KV");
  const double s = seconds_since(t0);
  (void)d.mem_free(kv);
  (void)d.mem_free(weights);
  return s;
}

struct TraceWindow {
  std::size_t calls = 0;
  std::size_t creates_or_maps = 0;
  std::size_t weight_maps_after_prewarm = 0;
};

// Driver calls by thread `tid` in [t0, t1], and cuMemMap calls into [lo, hi) after `after`.
TraceWindow read_trace(const std::string& path, long tid, std::int64_t t0, std::int64_t t1,
                       std::uint64_t lo, std::uint64_t hi, std::int64_t after) {
  TraceWindow w;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    const std::int64_t t = j.value("t_ns", std::int64_t{0});
    const std::string call = j.value("call", "");
    if (j.value("tid", 0L) == tid && t >= t0 && t <= t1) {
      ++w.calls;
      if (call == "cuMemCreate" || call == "cuMemMap") ++w.creates_or_maps;
    }
    if (call == "cuMemMap" && t > after && j.contains("args")) {
      const auto& ptr = j["args"]["ptr"];
      std::uint64_t p = ptr.is_string() ? std::stoull(ptr.get<std::string>(), nullptr, 0)
                                        : ptr.get<std::uint64_t>();
      if (p >= lo && p < hi) ++w.weight_maps_after_prewarm;
    }
  }
  return w;
}

// Median of three or more timings (sorted copy).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct CopyRate {
  std::uint64_t bytes = 0;
  std::vector<double> runs_s;
  double median_s = 0;
  double bytes_per_s() const { return median_s > 0 ? static_cast<double>(bytes) / median_s : 0; }
};

// `runs` copies of `bytes` from `src` to `dst` on `stream`, each timed on the host from the
// call to the end of cuStreamSynchronize (a pageable copy may return only when done).
CopyRate measure_copy(const cuda::Driver& d, CUstream stream, CUdeviceptr dst, const void* src,
                      std::uint64_t bytes, int runs) {
  CopyRate r;
  r.bytes = bytes;
  // One small copy first: the stream's and the copy engine's first use is not a rate.
  must(d.memcpy_htod_async(dst, src, std::min<std::uint64_t>(bytes, 2 * kMiB), stream), "copy");
  must(d.stream_synchronize(stream), "sync");
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    must(d.memcpy_htod_async(dst, src, bytes, stream), "cuMemcpyHtoDAsync (copy-rate probe)");
    must(d.stream_synchronize(stream), "sync");
    r.runs_s.push_back(seconds_since(t0));
  }
  r.median_s = median(r.runs_s);
  return r;
}

struct Options {
  std::string dir_a, dir_b;
  bool json_stdout = false;
  std::string json_file;
  std::uint64_t copy_bytes = 0;  // 0: min(1 GiB, B's largest file, free device memory / 4)
  std::string expect_driver;     // "", "emulator" or "real"
};

constexpr const char* kUsage = R"(usage: thaw-vmm-bench [OPTIONS] MODEL_A_DIR MODEL_B_DIR

Issue 6 benchmarks of thaw's VMM prewarm slots on whatever libcuda.so.1 loads (or
$THAW_LIBCUDA): the host->device copy rate (pinned and from mmap'ed file pages), prewarm
of B (thaw vs a naive create+map-then-copy loader), activation of B, and switching A -> B
vs a cold load of B. MODEL_A_DIR and MODEL_B_DIR are safetensors model directories
(thaw-genmodel makes them); B should be the larger. bench/vmm/run.sh runs it.

On thaw's emulator (detected by its thawEmuGetDeviceStats symbol) with its timing model,
shares are of the configured PCIe rate ($THAW_EMU_PCIE_GBPS, default 25) and the measured
rate is reported beside them; on a real driver, shares are of the measured pinned rate.
The activation thread check needs the emulator's trace ($THAW_EMU_TRACE); without it the
check is reported as not done.

options:
  --json                 print the results as JSON on stdout instead of text
  --json-file FILE       also write the JSON to FILE
  --copy-size SIZE       bytes per copy-rate probe (suffix K, M or G for KiB, MiB, GiB);
                         default min(1G, B's largest file, free device memory / 4)
  --expect-driver KIND   fail unless the driver loaded is KIND: emulator or real
  -h, --help             this text
)";

[[noreturn]] void usage_error(const std::string& message) {
  fmt::print(stderr, "vmm_bench: {}\n(thaw-vmm-bench --help lists the options)\n", message);
  std::exit(2);
}

std::uint64_t parse_size(const std::string& option, const std::string& text) {
  std::size_t end = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &end);
  } catch (const std::exception&) {
    usage_error(fmt::format("{} '{}': not a size (e.g. 256M, 1G, 1073741824)", option, text));
  }
  std::string suffix = text.substr(end);
  std::uint64_t unit = 1;
  if (suffix == "K" || suffix == "KiB")
    unit = 1 << 10;
  else if (suffix == "M" || suffix == "MiB")
    unit = kMiB;
  else if (suffix == "G" || suffix == "GiB")
    unit = 1 << 30;
  else if (!suffix.empty())
    usage_error(fmt::format("{} '{}': unknown suffix '{}' (K, M or G)", option, text, suffix));
  if (n == 0) usage_error(fmt::format("{} '{}': must be more than 0", option, text));
  return n * unit;
}

Options parse_options(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", arg));
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", kUsage);
      std::exit(0);
    } else if (arg == "--json") {
      o.json_stdout = true;
    } else if (arg == "--json-file") {
      o.json_file = value();
    } else if (arg == "--copy-size") {
      o.copy_bytes = parse_size(arg, value());
    } else if (arg == "--expect-driver") {
      o.expect_driver = value();
      if (o.expect_driver != "emulator" && o.expect_driver != "real")
        usage_error(fmt::format("--expect-driver '{}': emulator or real", o.expect_driver));
    } else if (arg.size() > 1 && arg[0] == '-') {
      usage_error(fmt::format("unknown option '{}'", arg));
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) {
    usage_error(
        fmt::format("expected MODEL_A_DIR and MODEL_B_DIR, got {} director{}{}", positional.size(),
                    positional.size() == 1 ? "y" : "ies",
                    positional.empty() ? "" : fmt::format(" ({})", fmt::join(positional, ", "))));
  }
  o.dir_a = positional[0];
  o.dir_b = positional[1];
  for (const std::string& dir : positional) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      usage_error(fmt::format("{}: not a directory", dir));
    if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec))
      usage_error(
          fmt::format("{}: no config.json, not a model directory (thaw-genmodel makes one)", dir));
  }
  return o;
}

// An environment variable as a positive number, else `fallback`.
double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  return end != v && *end == '\0' && x > 0 ? x : fallback;
}

// The emulator's THAW_EMU_TIMING (on unless 0/false/off/no).
bool emu_timing_on() {
  const char* v = std::getenv("THAW_EMU_TIMING");
  if (v == nullptr) return true;
  const std::string s = v;
  return !(s == "0" || s == "false" || s == "off" || s == "no");
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  const std::string& dir_a = opt.dir_a;
  const std::string& dir_b = opt.dir_b;

  auto driver = must(cuda::Driver::load(), "loading the driver");
  const bool emulator = driver->symbol("thawEmuGetDeviceStats") != nullptr;
  const char* driver_kind = emulator ? "emulator" : "real";
  if (!opt.expect_driver.empty() && opt.expect_driver != driver_kind) {
    die(fmt::format("--expect-driver {}, but {} is {} (THAW_LIBCUDA={})", opt.expect_driver,
                    driver->path(), emulator ? "thaw's emulator" : "not thaw's emulator",
                    std::getenv("THAW_LIBCUDA") ? std::getenv("THAW_LIBCUDA") : "unset"));
  }
  // The trace is the emulator's: on a real driver the variable means nothing.
  const char* trace = emulator ? std::getenv("THAW_EMU_TRACE") : nullptr;
  // The configured rate, where the emulator's timing model charges it (its defaults:
  // 25 GB/s, 20 us per page operation); none on a real driver or with timing off.
  const bool modelled = emulator && emu_timing_on();
  const double configured_pcie = modelled ? env_number("THAW_EMU_PCIE_GBPS", 25) * 1e9 : 0;
  const double latency_s = env_number("THAW_EMU_PAGE_LATENCY_US", 20) * 1e-6;

  const vmm::WeightLayout layout_a = packed_layout(dir_a);
  const vmm::WeightLayout layout_b = packed_layout(dir_b);
  vmm::MappedFileSource source_a(dir_a), source_b(dir_b);
  // Map and fault in the source files once, before anything is timed: the daemon's host
  // cache is mapped long before a prewarm, and every loader below reads the same mappings.
  std::map<std::string, std::uint64_t> file_extent_b;
  for (auto [layout, source] : {std::pair{&layout_a, &source_a}, std::pair{&layout_b, &source_b}}) {
    for (const vmm::LayoutPiece& p : layout->pieces()) {
      const std::byte* bytes = must(source->wait_bytes(p.file, p.file_offset, p.bytes), "source");
      volatile std::byte sink{};
      for (std::uint64_t i = 0; i < p.bytes; i += 4096) sink = bytes[i];
      (void)sink;
      if (layout == &layout_b) {
        std::uint64_t& e = file_extent_b[std::string(p.file)];
        e = std::max(e, p.file_offset + p.bytes);
      }
    }
  }

  const std::uint64_t kv_bytes = 1024 * kMiB;
  vmm::GpuMemoryConfig config;
  config.pool_bytes = layout_a.extent() + layout_b.extent() + kv_bytes + 16 * kMiB;
  auto gpu = must(vmm::GpuMemory::create(driver, config), "GpuMemory");
  const CUstream stream = must(driver->stream_create(CU_STREAM_NON_BLOCKING), "stream");
  const CUdevice dev = gpu->device();
  const std::string device_name = must(driver->device_name(dev), "device name");
  const int driver_version = driver->driver_version().value_or(0);

  // 0. The copy rate itself: pinned, and from B's largest file as mapped (pageable), the
  // same bytes the loaders read. One size for both, so the two rates compare.
  const auto largest_file =
      std::max_element(file_extent_b.begin(), file_extent_b.end(),
                       [](const auto& x, const auto& y) { return x.second < y.second; });
  const cuda::MemInfo mem = must(driver->mem_get_info(), "cuMemGetInfo");
  std::uint64_t copy_bytes =
      opt.copy_bytes != 0
          ? opt.copy_bytes
          : std::min<std::uint64_t>({1024 * kMiB, largest_file->second, mem.free / 4});
  copy_bytes = std::min<std::uint64_t>(copy_bytes, largest_file->second);  // pageable source
  CopyRate pinned_rate, pageable_rate;
  {
    const CUdeviceptr dst = must(driver->mem_alloc(copy_bytes), "cuMemAlloc (copy-rate probe)");
    void* pinned = must(driver->mem_host_alloc(copy_bytes), "cuMemHostAlloc (copy-rate probe)");
    std::memset(pinned, 0x5a, copy_bytes);
    pinned_rate = measure_copy(*driver, stream, dst, pinned, copy_bytes, 3);
    must(driver->mem_free_host(pinned), "cuMemFreeHost");
    const std::byte* file =
        must(source_b.wait_bytes(largest_file->first, 0, copy_bytes), "source (copy-rate probe)");
    pageable_rate = measure_copy(*driver, stream, dst, file, copy_bytes, 3);
    must(driver->mem_free(dst), "cuMemFree (copy-rate probe)");
  }
  const double measured_pcie = pinned_rate.bytes_per_s();
  // What the shares and the cold load's floor are taken against.
  const double pcie = modelled ? configured_pcie : measured_pcie;

  // 1. Prewarm throughput, thaw vs naive (same bytes, same source, same stream kind).
  // Three prewarms of B (evicted in between), the median reported: the 2-core host's
  // scheduling moves a single run by a few per cent.
  const vmm::SlotId b = must(gpu->create_slot("model-b"), "slot B");
  std::vector<vmm::PrewarmReport> prewarms;
  for (int round = 0; round < 3; ++round) {
    if (round > 0) {
      must(gpu->evict(b), "evict B");
      gpu->wait_idle();
    }
    prewarms.push_back(must(gpu->prewarm(b, layout_b, source_b), "prewarm B"));
  }
  std::sort(prewarms.begin(), prewarms.end(),
            [](const auto& x, const auto& y) { return x.seconds < y.seconds; });
  const vmm::PrewarmReport prewarm_b = prewarms[1];
  const auto prewarm_end = Clock::now();
  const double naive_s = naive_prewarm(*driver, dev, layout_b, source_b, stream);
  const double b_bytes = static_cast<double>(layout_b.bytes());
  const double thaw_rate = b_bytes / prewarm_b.seconds;
  const double naive_rate = b_bytes / naive_s;
  // What the timing model alone charges the naive loader (create + map per page, then the
  // transfer): its floor when the host is fast enough, as on a GPU. Emulator only.
  const double naive_model_s =
      modelled ? static_cast<double>(prewarm_b.pages_mapped) * 2 * latency_s + b_bytes / pcie : 0;

  const vmm::SlotId a = must(gpu->create_slot("model-a"), "slot A");
  must(gpu->prewarm(a, layout_a, source_a), "prewarm A");

  // 2. Activation of B, seven times (median): time on this thread, and what the trace saw
  // this thread call meanwhile.
  const long tid = static_cast<long>(::syscall(SYS_gettid));
  std::vector<double> critical;
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;
  vmm::SlotInfo b_info;
  for (int round = 0; round < 7; ++round) {
    const auto act_t0 = Clock::now();
    const auto activation = must(gpu->activate(b, vmm::ActivationOptions{kv_bytes}), "activate B");
    const auto act_t1 = Clock::now();
    critical.push_back(std::chrono::duration<double, std::milli>(activation.critical_path).count());
    windows.emplace_back(steady_ns(act_t0), steady_ns(act_t1));
    must(gpu->ensure_kv(b, kv_bytes), "KV of B");
    gpu->wait_idle();
    b_info = must(gpu->slot(b), "slot B info");
    must(gpu->deactivate(b), "deactivate B");
    gpu->wait_idle();
  }
  const double critical_ms = median(critical);
  const double critical_max_ms = *std::max_element(critical.begin(), critical.end());
  TraceWindow window;
  if (trace != nullptr) {
    for (const auto& [t0, t1] : windows) {
      TraceWindow w = read_trace(trace, tid, t0, t1, b_info.base, b_info.base + layout_b.extent(),
                                 steady_ns(prewarm_end));
      window.calls += w.calls;
      window.creates_or_maps += w.creates_or_maps;
      window.weight_maps_after_prewarm = w.weight_maps_after_prewarm;
    }
  }

  // 3. Switch A -> B vs a cold load of B.
  // A takes every free page as KV, as a serving engine would, but B stays prewarmed. Five
  // switches, the median reported.
  std::vector<double> switches, switches_256;
  for (int round = 0; round < 5; ++round) {
    must(gpu->activate(a, vmm::ActivationOptions{kv_bytes}), "activate A");
    gpu->wait_idle();
    const auto sw_t0 = Clock::now();
    must(gpu->deactivate(a), "deactivate A");
    must(gpu->activate(b, vmm::ActivationOptions{kv_bytes}), "activate B");
    must(gpu->ensure_kv(b, 2 * kMiB), "first KV page of B");
    switches.push_back(seconds_since(sw_t0));
    must(gpu->ensure_kv(b, 256 * kMiB), "256 MiB KV of B");
    switches_256.push_back(seconds_since(sw_t0));
    gpu->wait_idle();
    must(gpu->deactivate(b), "deactivate B");
    gpu->wait_idle();
  }
  const double switch_s = median(switches);
  const double switch_256_s = median(switches_256);
  const double switch_max_s = *std::max_element(switches.begin(), switches.end());
  // The cold load's floor: its bytes at the reference PCIe rate (configured on the
  // emulator, measured pinned on a GPU).
  const double cold_floor_s = b_bytes / pcie;
  const double cold_s = cold_load(*driver, layout_b, source_b, stream, 256 * kMiB);

  (void)driver->stream_destroy(stream);
  gpu.reset();

  const bool prewarm_ok = thaw_rate / pcie >= 0.95;
  const bool naive_ok = naive_rate / pcie <= 0.70;
  const bool activation_ok =
      critical_ms <= 1.0 && (trace == nullptr || window.creates_or_maps == 0);
  const bool switch_ok = cold_s / switch_s >= 50 && cold_floor_s / switch_s >= 50;
  using nlohmann::json;
  auto or_null = [](bool have, auto v) { return have ? json(v) : json(nullptr); };
  auto copy_json = [](const CopyRate& r) {
    return json{{"bytes", r.bytes},
                {"s_runs", r.runs_s},
                {"s_median", r.median_s},
                {"gbps", r.bytes_per_s() / 1e9}};
  };
  json out = {{"device_name", device_name},
              {"driver", driver_kind},
              {"driver_path", driver->path()},
              {"driver_version", driver_version},
              {"pcie_configured_gbps", or_null(modelled, configured_pcie / 1e9)},
              {"pcie_measured_gbps", measured_pcie / 1e9},
              {"pcie_measured_pageable_gbps", pageable_rate.bytes_per_s() / 1e9},
              {"pcie_reference", modelled ? "configured" : "measured"},
              {"pcie_bytes_per_s", pcie},
              {"copy_rate",
               {{"pinned", copy_json(pinned_rate)}, {"pageable_mmap", copy_json(pageable_rate)}}},
              {"model_a_bytes", layout_a.bytes()},
              {"model_b_bytes", layout_b.bytes()},
              {"prewarm",
               {{"thaw_s", prewarm_b.seconds},
                {"thaw_s_runs", {prewarms[0].seconds, prewarms[1].seconds, prewarms[2].seconds}},
                {"thaw_gbps", thaw_rate / 1e9},
                {"thaw_share_of_pcie", thaw_rate / pcie},
                {"thaw_share_of_measured_pcie", thaw_rate / measured_pcie},
                {"naive_s", naive_s},
                {"naive_gbps", naive_rate / 1e9},
                {"naive_share_of_pcie", naive_rate / pcie},
                {"naive_share_of_measured_pcie", naive_rate / measured_pcie},
                // Of the rate from mmap'ed file pages: both loaders read such pages (thaw through
                // pinned staging), so on a real host this can be the tighter ceiling.
                {"thaw_share_of_pageable_pcie", thaw_rate / pageable_rate.bytes_per_s()},
                {"naive_share_of_pageable_pcie", naive_rate / pageable_rate.bytes_per_s()},
                {"thaw_over_naive", naive_s / prewarm_b.seconds},
                {"naive_modelled_floor_s", or_null(modelled, naive_model_s)},
                {"naive_modelled_share_of_pcie", or_null(modelled, b_bytes / naive_model_s / pcie)},
                {"copies", prewarm_b.copies},
                {"pages", prewarm_b.pages_mapped}}},
              {"activation",
               {{"critical_path_ms_median", critical_ms},
                {"critical_path_ms_max", critical_max_ms},
                {"critical_path_ms_runs", critical},
                {"traced", trace != nullptr},
                {"driver_calls_on_caller", or_null(trace != nullptr, window.calls)},
                {"create_or_map_on_caller", or_null(trace != nullptr, window.creates_or_maps)},
                {"weight_page_maps_after_prewarm",
                 or_null(trace != nullptr, window.weight_maps_after_prewarm)}}},
              {"switch",
               {{"switch_ms", switch_s * 1e3},
                {"switch_ms_max", switch_max_s * 1e3},
                {"switch_with_256MiB_kv_ms", switch_256_s * 1e3},
                {"cold_load_ms", cold_s * 1e3},
                {"cold_load_floor_ms", cold_floor_s * 1e3},
                {"speedup", cold_s / switch_s},
                {"speedup_vs_floor", cold_floor_s / switch_s},
                {"speedup_256MiB_kv", cold_s / switch_256_s},
                // The earlier names, in seconds.
                {"switch_s", switch_s},
                {"switch_s_max", switch_max_s},
                {"switch_with_256MiB_kv_s", switch_256_s},
                {"cold_load_s", cold_s},
                {"cold_load_modelled_floor_s", cold_floor_s}}},
              {"targets",
               {{"prewarm_share_ge_95", prewarm_ok},
                {"naive_share_le_70", naive_ok},
                {"activation_le_1ms", activation_ok},
                {"switch_ge_50x", switch_ok}}}};
  if (!opt.json_file.empty()) {
    std::ofstream f(opt.json_file);
    f << out.dump(2) << "\n";
    if (!f) die(fmt::format("{}: cannot write the JSON", opt.json_file));
  }
  if (opt.json_stdout) {
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  auto verdict = [](bool ok) { return ok ? "meets" : "MISSES"; };
  const std::string ref = modelled ? "configured PCIe" : "measured PCIe";
  fmt::print("{} ({} driver {}.{}, {}); model A {:.2f} GB, model B {:.2f} GB (packed layouts)\n",
             device_name, driver_kind, driver_version / 1000, driver_version % 1000 / 10,
             driver->path(), layout_a.bytes() / 1e9, layout_b.bytes() / 1e9);
  fmt::print(
      "0. host->device copy of {:.0f} MiB (3 runs each): pinned {:.2f} GB/s, from mmap'ed file "
      "pages {:.2f} GB/s{}; shares below are of the {}\n",
      copy_bytes / double(kMiB), measured_pcie / 1e9, pageable_rate.bytes_per_s() / 1e9,
      modelled ? fmt::format(" (configured {:.1f} GB/s)", configured_pcie / 1e9) : std::string(),
      modelled ? fmt::format("configured {:.1f} GB/s", configured_pcie / 1e9)
               : fmt::format("measured pinned {:.2f} GB/s", measured_pcie / 1e9));
  fmt::print(
      "1. prewarm of B (3 runs: {:.3f} {:.3f} {:.3f} s): thaw median {:.3f} s = {:.1f} % of "
      "{} ({}{:.1f} % of the pageable rate; {} copies, {} pages); naive create+map all, then "
      "copy {:.3f} s = {:.1f} % ({}{:.1f} % of pageable){}  (targets >= 95 %: {}, <= 70 %: {})\n",
      prewarms[0].seconds, prewarms[1].seconds, prewarms[2].seconds, prewarm_b.seconds,
      100 * thaw_rate / pcie, ref,
      modelled ? fmt::format("{:.1f} % of measured pinned, ", 100 * thaw_rate / measured_pcie)
               : std::string(),
      100 * thaw_rate / pageable_rate.bytes_per_s(), prewarm_b.copies, prewarm_b.pages_mapped,
      naive_s, 100 * naive_rate / pcie,
      modelled ? fmt::format("{:.1f} % of measured pinned, ", 100 * naive_rate / measured_pcie)
               : std::string(),
      100 * naive_rate / pageable_rate.bytes_per_s(),
      modelled ? fmt::format(" (its modelled floor {:.3f} s = {:.1f} %)", naive_model_s,
                             100 * b_bytes / naive_model_s / pcie)
               : std::string(),
      verdict(prewarm_ok), verdict(naive_ok));
  fmt::print(
      "2. activation of B (7 runs): critical path median {:.3f} ms, max {:.3f} ms (target "
      "<= 1 ms: {}); {}\n",
      critical_ms, critical_max_ms, verdict(activation_ok),
      trace
          ? fmt::format("driver calls on the caller meanwhile: {} ({} cuMemCreate/cuMemMap); "
                        "cuMemMap of B's weight pages after its prewarm: {}",
                        window.calls, window.creates_or_maps, window.weight_maps_after_prewarm)
          : std::string(emulator ? "driver calls on the caller: not checked (THAW_EMU_TRACE unset)"
                                 : "driver calls on the caller: not checked (no trace on a "
                                   "real driver)"));
  fmt::print(
      "3. switch A -> B until B can serve (5 runs): median {:.3f} ms, max {:.3f} ms ({:.3f} ms "
      "with 256 MiB of KV); cold load of B {:.3f} s (its floor at the {} {:.3f} s); speedup "
      "{:.0f}x, {:.0f}x against the floor ({:.0f}x with 256 MiB of KV)  (target >= 50x: {})\n",
      switch_s * 1e3, switch_max_s * 1e3, switch_256_s * 1e3, cold_s, ref, cold_floor_s,
      cold_s / switch_s, cold_floor_s / switch_s, cold_s / switch_256_s, verdict(switch_ok));
  return 0;
}
