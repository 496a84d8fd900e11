// Emulator configuration, read once from THAW_EMU_* environment variables.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <string>
#include <vector>

namespace emu {

struct Config {
  int device_count = 1;
  std::vector<std::uint64_t> device_memory;  // bytes, one per device
  std::string device_name = "NVIDIA H100 80GB HBM3";
  // Where the per-device memory ledgers live. Every process pointing at the same
  // directory shares the emulated GPUs, as processes on one machine share real ones.
  std::string state_dir = "/dev/shm/thaw-emu";
  bool timing = true;
  // Populate physical memory when it is created (a GPU's memory is there once cuMemCreate
  // returns; a memfd's pages only on first touch, which costs a host page fault and a
  // zeroing per 4 KiB in the first copy into it). Off by default to keep tests light.
  bool prefault = false;
  double pcie_bytes_per_s = 25e9;   // H2D and D2H, each direction
  double d2d_bytes_per_s = 2000e9;  // HBM: device-to-device copies and memsets
  // WarmServe: mapping 10 GB takes about 0.2 s, i.e. ~20 us per 2 MiB page.
  std::chrono::nanoseconds page_latency{20'000};
  std::chrono::nanoseconds launch_latency{5'000};
  // Graphs. MEDUSA (Qwen1.5 4B: 16,150 nodes over 35 graphs, 0.9 s of capture stage)
  // gives ~55 us per node for capturing plus instantiating; split 30 + 25.
  std::chrono::nanoseconds capture_node_cost{30'000};
  std::chrono::nanoseconds instantiate_node_cost{25'000};
  // A replayed graph launches its nodes with far less CPU overhead than separate launches.
  std::chrono::nanoseconds graph_node_latency{1'000};
  // What cuGraphKernelNodeGetAttribute answers for a kernel node that never had the attribute
  // set (or was set to "none"). CUDA's headers name CU_SHAREDMEM_CARVEOUT_DEFAULT (-1) and a
  // cluster of 0 as the defaults, but nothing says a real driver answers them; these let the
  // emulator be a driver that answers otherwise (a carveout of 0, a cluster of [1, 1, 1]), so
  // tests show thaw probes the defaults instead of assuming them. Only the answer changes: the
  // node runs as before.
  std::uint32_t reported_carveout_default = 0xffff'ffffu;  // THAW_EMU_CARVEOUT_DEFAULT
  std::uint32_t reported_cluster_default = 0;              // THAW_EMU_CLUSTER_DEFAULT (0 or 1)
  std::string trace_path;
  std::string faults_spec;
};

// The message names the variable, the bad value and what is expected.
std::expected<Config, std::string> config_from_env();

// "80G", "512M", "4096", "1.5G" -> bytes (binary multiples).
std::expected<std::uint64_t, std::string> parse_size(const std::string& text);

}  // namespace emu
