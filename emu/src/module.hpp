// Modules, functions, libraries and kernels: what cuModuleLoad* and cuLibraryLoad* make
// of a cubin, and the host twins that run its kernels.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cubin.hpp"
#include "handles.hpp"
#include "thaw/emu_twin.h"

namespace emu {

struct Function {  // CUfunction: a kernel of a module (in one context)
  std::uint64_t handle = 0;
  std::uint64_t module = 0;
  std::size_t index = 0;  // into the module's kernels
  std::shared_ptr<const CubinInfo> image;
  const KernelInfo& info() const { return image->kernels[index]; }
  // Lazy loading (CUDA_MODULE_LOADING=LAZY, the default): resolved on first use.
  bool loaded = false;
  const ThawEmuTwin* twin = nullptr;
  int max_dynamic_shared = 48 * 1024;
  // Static shared memory the kernel declares. On sm_80+ ptxas puts the 1 KiB the hardware
  // reserves per block into .nv.shared.<kernel> too; the driver reports it separately
  // (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK), so it is not counted here.
  int static_shared = 0;
  int preferred_carveout = -1;
  std::map<int, int> attributes;  // other settable attributes, as set
};

struct DeviceGlobal {
  CUdeviceptr ptr = 0;
  std::uint64_t size = 0;
};

struct Module {  // CUmodule
  std::uint64_t handle = 0;
  std::uint64_t ctx = 0;
  std::uint64_t library = 0;  // the library it was made for, if any
  std::shared_ptr<const CubinInfo> image;
  std::vector<std::uint64_t> functions;  // in kernel order
  std::map<std::string, DeviceGlobal> globals;
  std::vector<CUdeviceptr> allocations;  // backing of the globals
};

struct Kernel {  // CUkernel: a library's kernel, context-independent
  std::uint64_t handle = 0;
  std::uint64_t library = 0;
  std::size_t index = 0;
};

struct Library {  // CUlibrary
  std::uint64_t handle = 0;
  std::shared_ptr<const CubinInfo> image;
  std::vector<std::uint64_t> kernels;
  std::unordered_map<std::uint64_t, std::uint64_t> module_of_ctx;
};

// All module objects of the process; guarded by driver().mu.
struct ModuleTables {
  HandleTable<Module> modules{HandleTag::kModule};
  HandleTable<Function> functions{HandleTag::kFunction};
  HandleTable<Library> libraries{HandleTag::kLibrary};
  HandleTable<Kernel> kernels{HandleTag::kKernel};
};
ModuleTables& module_tables();

struct Context;
class Call;

// The function a launch of `handle` (a CUfunction, or a CUkernel used as one) runs in
// `ctx`, resolved (twin looked up) on this first use. Caller holds driver().mu.
std::expected<std::shared_ptr<Function>, CUresult> function_for_launch_locked(std::uint64_t handle,
                                                                              Context& ctx,
                                                                              Call& c);
// Unloads the modules of a context being destroyed. Caller holds driver().mu.
void unload_context_modules_locked(Context& ctx);

// The twin for a mangled kernel name from the libraries in THAW_EMU_KERNELS, or null.
const ThawEmuTwin* find_twin(const std::string& kernel);
// The libraries searched, for error messages.
std::string twin_libraries();

// Whether modules load lazily (CUDA_MODULE_LOADING, default LAZY as in CUDA 12+).
bool lazy_loading();

}  // namespace emu
