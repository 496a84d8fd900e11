// thaw-emu-demo: what `make demo` runs until the real demo lands.
//
// A small CUDA driver API program run through thaw's driver table (common/cuda) on the
// CPU emulator of the driver (emu/): it lists the devices, does a VMM round trip
// (create, reserve, map, set access, write and read back, unmap, release, free) and
// times an async pinned host-to-device copy against the emulator's PCIe model. Every
// step goes through dlopen + cuGetProcAddress exactly as it would on NVIDIA's driver,
// so pointing THAW_LIBCUDA at libcuda.so.1 runs the same program on a real GPU.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/cuda/driver.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::cuda::CudaError;
using thaw::cuda::Driver;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kVmmBytes = 64 * kMiB;
constexpr double kDefaultPcieGbps = 25.0;  // the emulator's default (THAW_EMU_PCIE_GBPS)

constexpr std::string_view kUsage = R"(usage: thaw-emu-demo [--json] [--size-mib N] [--libcuda PATH]

Runs a small CUDA driver API program through thaw's driver table on the CUDA
driver emulator: lists the devices, does a VMM map/unmap round trip and times an
async pinned host-to-device copy against the emulator's PCIe model.

  --json         print a machine-readable summary (JSON) instead of text
  --size-mib N   size of the timed host-to-device copy in MiB (default 256)
  --libcuda PATH driver library to load (default: $THAW_LIBCUDA, else the emulator
                 built next to this program, ../../emu/libcuda.so.1)
  --help         this text

The emulator reads its settings from the environment, e.g. THAW_EMU_PCIE_GBPS
(default 25), THAW_EMU_DEVICES, THAW_EMU_DEVICE_MEMORY, THAW_EMU_TIMING (1, on).
)";

struct Options {
  bool json = false;
  size_t copy_mib = 256;
  std::string libcuda;  // empty: $THAW_LIBCUDA, else the emulator next to the executable
};

// A failed step: what was being done and why it failed. Ends the demo with exit 1.
struct StepFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
T need(std::expected<T, CudaError> result, std::string_view step) {
  if (!result) {
    const CudaError& e = result.error();
    // Most steps are named after the call, which the error already names.
    throw StepFailed(e.call == step ? e.what() : fmt::format("{}: {}", step, e.what()));
  }
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Runs `fn`, which returns std::expected<T, CudaError>, and times it in milliseconds.
template <class Fn>
auto timed(Fn&& fn, std::string_view step, double& ms) {
  auto start = Clock::now();
  auto result = fn();
  ms = ms_since(start);
  using T = typename decltype(result)::value_type;
  return need<T>(std::move(result), step);
}

std::optional<Options> parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", arg));
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return std::nullopt;
    } else if (arg == "--json") {
      opt.json = true;
    } else if (arg == "--size-mib") {
      std::string v(value());
      char* end = nullptr;
      unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n == 0 || n > (size_t{1} << 20)) {
        throw std::invalid_argument(
            fmt::format("--size-mib wants a whole number of MiB > 0, not "
                        "\"{}\"",
                        v));
      }
      opt.copy_mib = n;
    } else if (arg == "--libcuda") {
      opt.libcuda = value();
    } else {
      throw std::invalid_argument(fmt::format("unknown argument \"{}\"", arg));
    }
  }
  return opt;
}

// The driver to load: --libcuda, else $THAW_LIBCUDA, else the emulator of the same
// build tree (this program is build/<preset>/tools/emu-demo/thaw-emu-demo, the
// emulator build/<preset>/emu/libcuda.so.1).
std::string driver_path(const Options& opt) {
  if (!opt.libcuda.empty()) return opt.libcuda;
  if (const char* env = std::getenv(thaw::cuda::kLibcudaEnv); env != nullptr && *env != '\0') {
    return env;
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw StepFailed(fmt::format("cannot read /proc/self/exe: {}", ec.message()));
  fs::path emulator = (exe.parent_path() / "../../emu/libcuda.so.1").lexically_normal();
  if (!fs::exists(emulator)) {
    throw StepFailed(fmt::format(
        "no emulator at {}: build it (cmake --build --preset default --target thaw_emu), or "
        "set THAW_LIBCUDA (or --libcuda) to a driver",
        emulator.string()));
  }
  return emulator.string();
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return (*end == '\0' && d > 0) ? d : fallback;
}

std::string mib(size_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / static_cast<double>(kMiB));
}

std::string gib(size_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / static_cast<double>(kMiB * 1024));
}

// Text goes to stdout as the demo runs, unless --json, which prints one object at the end.
class Report {
 public:
  explicit Report(bool json) : json_mode_(json) {}

  template <class... Args>
  void say(fmt::format_string<Args...> f, Args&&... args) {
    if (!json_mode_) fmt::print("{}\n", fmt::format(f, std::forward<Args>(args)...));
  }
  json& data() { return data_; }
  void finish() {
    if (json_mode_) fmt::print("{}\n", data_.dump(2));
  }

 private:
  bool json_mode_;
  json data_ = json::object();
};

void list_devices(const Driver& cu, Report& out) {
  int count = need(cu.device_count(), "cuDeviceGetCount");
  out.say("devices: {}", count);
  json devices = json::array();
  for (int i = 0; i < count; ++i) {
    CUdevice dev = need(cu.device_get(i), "cuDeviceGet");
    std::string name = need(cu.device_name(dev), "cuDeviceGetName");
    size_t total = need(cu.device_total_mem(dev), "cuDeviceTotalMem");
    auto attr = [&](CUdevice_attribute a) {
      return need(cu.device_attribute(dev, a), "cuDeviceGetAttribute");
    };
    int major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    int minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    int sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    std::string uuid = thaw::cuda::format_uuid(need(cu.device_uuid(dev), "cuDeviceGetUuid"));
    out.say("  [{}] {}: {} memory, compute capability {}.{}, {} SMs, {}", i, name, gib(total),
            major, minor, sms, uuid);
    devices.push_back({{"ordinal", i},
                       {"name", name},
                       {"total_bytes", total},
                       {"compute_capability", fmt::format("{}.{}", major, minor)},
                       {"sm_count", sms},
                       {"uuid", uuid}});
  }
  if (count == 0) throw StepFailed("the driver reports no devices");
  out.data()["devices"] = devices;
}

// cuMemCreate → cuMemAddressReserve → cuMemMap → cuMemSetAccess → write + read back →
// cuMemUnmap → cuMemRelease → cuMemAddressFree, each step timed.
void vmm_round_trip(const Driver& cu, CUdevice dev, Report& out) {
  CUmemAllocationProp prop = thaw::cuda::device_allocation_prop(dev);
  size_t min_gran = need(cu.allocation_granularity(prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                         "cuMemGetAllocationGranularity");
  size_t rec_gran = need(cu.allocation_granularity(prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                         "cuMemGetAllocationGranularity");
  size_t bytes = (kVmmBytes + min_gran - 1) / min_gran * min_gran;
  out.say("\nVMM round trip on device 0 ({}, granularity {} minimum, {} recommended):", mib(bytes),
          mib(min_gran), mib(rec_gran));

  json steps = json::object();
  auto step = [&](std::string_view name, double ms, std::string_view detail = {}) {
    steps[std::string(name.substr(0, name.find(' ')))] = ms;  // the call's name
    out.say("  {:<30} {:>9.3f} ms{}{}", name, ms, detail.empty() ? "" : "  ", detail);
  };

  double ms = 0;
  CUmemGenericAllocationHandle handle =
      timed([&] { return cu.mem_create(bytes, prop); }, "cuMemCreate", ms);
  step("cuMemCreate", ms, fmt::format("{} pages of 2 MiB", bytes / (2 * kMiB)));
  CUdeviceptr va =
      timed([&] { return cu.address_reserve(bytes, min_gran); }, "cuMemAddressReserve", ms);
  step("cuMemAddressReserve", ms, fmt::format("at 0x{:x}", va));
  timed([&] { return cu.mem_map(va, bytes, 0, handle); }, "cuMemMap", ms);
  step("cuMemMap", ms);
  timed([&] { return cu.mem_set_access(va, bytes, dev); }, "cuMemSetAccess", ms);
  step("cuMemSetAccess (read-write)", ms);

  std::vector<unsigned char> pattern(bytes), back(bytes);
  for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<unsigned char>(i * 131 + 7);
  timed([&] { return cu.memcpy_htod(va, pattern.data(), bytes); }, "cuMemcpyHtoD", ms);
  step("cuMemcpyHtoD (write pattern)", ms);
  timed([&] { return cu.memcpy_dtoh(back.data(), va, bytes); }, "cuMemcpyDtoH", ms);
  bool same = std::memcmp(pattern.data(), back.data(), bytes) == 0;
  step("cuMemcpyDtoH (read back)", ms, same ? "bytes match" : "MISMATCH");
  if (!same) throw StepFailed("VMM round trip: the bytes read back differ from those written");

  timed([&] { return cu.mem_unmap(va, bytes); }, "cuMemUnmap", ms);
  step("cuMemUnmap", ms);
  timed([&] { return cu.mem_release(handle); }, "cuMemRelease", ms);
  step("cuMemRelease", ms);
  timed([&] { return cu.address_free(va, bytes); }, "cuMemAddressFree", ms);
  step("cuMemAddressFree", ms);

  out.data()["vmm"] = {{"bytes", bytes},
                       {"granularity_minimum", min_gran},
                       {"granularity_recommended", rec_gran},
                       {"verified", same},
                       {"steps_ms", steps}};
}

// An async H2D copy from pinned memory on a stream, timed with events and with the
// wall clock, next to what the PCIe model says it should take.
void timed_h2d_copy(const Driver& cu, size_t bytes, Report& out) {
  double gbps = env_double("THAW_EMU_PCIE_GBPS", kDefaultPcieGbps);
  const char* timing_env = std::getenv("THAW_EMU_TIMING");
  bool timing_on = timing_env == nullptr || std::string_view(timing_env) != "0";
  double model_ms = static_cast<double>(bytes) / (gbps * 1e9) * 1e3;
  out.say("\nasync host-to-device copy of {} from pinned memory:", mib(bytes));

  void* host = need(cu.mem_host_alloc(bytes), "cuMemHostAlloc");
  auto* bytes_in = static_cast<unsigned char*>(host);
  for (size_t i = 0; i < bytes; ++i) bytes_in[i] = static_cast<unsigned char>(i);
  CUdeviceptr dev = need(cu.mem_alloc(bytes), "cuMemAlloc");
  CUstream stream = need(cu.stream_create(CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUevent start = need(cu.event_create(), "cuEventCreate");
  CUevent end = need(cu.event_create(), "cuEventCreate");

  // Warm-up: the first touch of fresh (emulated) device memory costs page faults that
  // a real GPU does not have; time the steady state.
  need(cu.memcpy_htod_async(dev, host, bytes, stream), "cuMemcpyHtoDAsync (warm-up)");
  need(cu.stream_synchronize(stream), "cuStreamSynchronize");

  auto wall_start = Clock::now();
  need(cu.event_record(start, stream), "cuEventRecord");
  need(cu.memcpy_htod_async(dev, host, bytes, stream), "cuMemcpyHtoDAsync");
  double enqueue_ms = ms_since(wall_start);
  need(cu.event_record(end, stream), "cuEventRecord");
  need(cu.event_synchronize(end), "cuEventSynchronize");
  double wall_ms = ms_since(wall_start);
  float event_ms = need(cu.event_elapsed_ms(start, end), "cuEventElapsedTime");

  std::vector<unsigned char> check(std::min<size_t>(bytes, kMiB));
  need(cu.memcpy_dtoh(check.data(), dev + bytes - check.size(), check.size()), "cuMemcpyDtoH");
  bool same = std::memcmp(check.data(), bytes_in + bytes - check.size(), check.size()) == 0;

  need(cu.event_destroy(start), "cuEventDestroy");
  need(cu.event_destroy(end), "cuEventDestroy");
  need(cu.stream_destroy(stream), "cuStreamDestroy");
  need(cu.mem_free(dev), "cuMemFree");
  need(cu.mem_free_host(host), "cuMemFreeHost");
  if (!same) throw StepFailed("async copy: the bytes on the device differ from the source");

  double ratio = event_ms / model_ms;
  out.say("  enqueue (returns at once)   {:>9.3f} ms", enqueue_ms);
  out.say("  on the stream (events)      {:>9.3f} ms  = {:.1f} GB/s", event_ms,
          static_cast<double>(bytes) / (event_ms * 1e6));
  out.say("  wall clock                  {:>9.3f} ms", wall_ms);
  out.say("  PCIe model                  {:>9.3f} ms  ({} / {} GB/s{})", model_ms, mib(bytes), gbps,
          timing_on ? "" : "; THAW_EMU_TIMING=0: the model is off");
  out.say("  measured / model            {:>9.2f}", ratio);
  if (timing_on && ratio > 1.1) {
    // The emulator never finishes a copy before the host has really moved the bytes,
    // so a model faster than this host's memcpy shows up as a ratio above 1.
    double host_gbps = static_cast<double>(bytes) / (event_ms * 1e6);
    out.say(
        "  (slower than the model: this host moved the bytes at only {:.1f} GB/s; run with\n"
        "   THAW_EMU_PCIE_GBPS={:.0f} to see the model govern the copy)",
        host_gbps, std::max(1.0, std::floor(host_gbps / 2)));
  }
  out.data()["h2d_copy"] = {{"bytes", bytes},
                            {"pinned", true},
                            {"enqueue_ms", enqueue_ms},
                            {"event_ms", event_ms},
                            {"wall_ms", wall_ms},
                            {"model_ms", model_ms},
                            {"pcie_gbps", gbps},
                            {"ratio_event_to_model", ratio},
                            {"timing_model", timing_on},
                            {"verified", same}};
}

int run(const Options& opt) {
  Report out(opt.json);
  std::string path = driver_path(opt);
  auto loaded = Driver::load(path);
  if (!loaded) throw StepFailed(fmt::format("loading the driver: {}", loaded.error().what()));
  const Driver& cu = **loaded;

  need(cu.init(), "cuInit");
  int version = need(cu.driver_version(), "cuDriverGetVersion");
  out.say("driver: {} (CUDA {}.{}), entry points resolved at CUDA {}.{}", cu.path(), version / 1000,
          version % 1000 / 10, thaw::cuda::kCudaVersion / 1000,
          thaw::cuda::kCudaVersion % 1000 / 10);
  out.data()["driver"] = {{"path", cu.path()}, {"version", version}};

  list_devices(cu, out);

  CUdevice dev = need(cu.device_get(0), "cuDeviceGet");
  CUcontext ctx = need(cu.primary_ctx_retain(dev), "cuDevicePrimaryCtxRetain");
  need(cu.ctx_set_current(ctx), "cuCtxSetCurrent");
  thaw::cuda::MemInfo before = need(cu.mem_get_info(), "cuMemGetInfo");
  out.say("\ndevice 0 memory: {} free of {}", gib(before.free), gib(before.total));

  vmm_round_trip(cu, dev, out);
  timed_h2d_copy(cu, opt.copy_mib * kMiB, out);

  need(cu.ctx_synchronize(), "cuCtxSynchronize");
  thaw::cuda::MemInfo after = need(cu.mem_get_info(), "cuMemGetInfo");
  out.say("\ndevice 0 memory: {} free before, {} free after{}", gib(before.free), gib(after.free),
          after.free == before.free ? " (everything released)" : "");
  out.data()["memory"] = {
      {"total", before.total}, {"free_before", before.free}, {"free_after", after.free}};

  need(cu.ctx_set_current(nullptr), "cuCtxSetCurrent");
  need(cu.primary_ctx_release(dev), "cuDevicePrimaryCtxRelease");
  out.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::optional<Options> opt = parse(argc, argv);
    if (!opt) return 0;
    return run(*opt);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "thaw-emu-demo: {}\n{}", e.what(), kUsage);
    return 2;
  } catch (const StepFailed& e) {
    fmt::print(stderr, "thaw-emu-demo: failed: {}\n", e.what());
    return 1;
  }
}
