// THAW_EMU_FAULTS: make the Nth call of a driver function fail with a chosen error,
// so tests can drive thaw's error paths deterministically.
//
//   THAW_EMU_FAULTS="cuMemCreate:3=CUDA_ERROR_OUT_OF_MEMORY,cuMemMap:2+=999"
//   ":N"  fails only the Nth call (1-based) of that function in this process;
//   ":N+" fails the Nth and every later call. Names are base names (no _v2/_ptsz).
#pragma once

#include <cuda.h>

#include <expected>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace emu {

class Faults {
 public:
  std::expected<void, std::string> configure(const std::string& spec);
  // Counts this call; returns the error to inject, if any. An injected call has no effect.
  std::optional<CUresult> check(const char* name);
  bool empty() const { return rules_.empty(); }

 private:
  struct Rule {
    std::string name;
    unsigned long nth;
    bool and_later;
    CUresult error;
  };
  std::mutex mu_;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, unsigned long> calls_;
};

Faults& faults();

// Whether `base_name` is an entry point of the emulated driver (cuGetProcAddress table).
bool is_driver_function(const std::string& base_name);

}  // namespace emu
