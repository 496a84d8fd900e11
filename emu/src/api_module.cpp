// Modules and libraries from real cubin images: cuModuleLoad*, cuModuleGet*, cuFunc*,
// cuLibrary*, cuKernel*. Names and parameter layouts come from the cubin's ELF
// (cubin.hpp); kernels run as host twins (thaw/emu_twin.h, module.hpp).
#include <fstream>
#include <iterator>

#include "api_common.hpp"
#include "fatbin.hpp"
#include "module.hpp"

using namespace emu;

namespace {

constexpr int kDeviceSm = 90;
constexpr int kMaxSharedPerBlockOptin = 232448;
constexpr unsigned kReservedSharedPerBlock = 1024;

// The size of an image cuModuleLoadData gets without one: from its own headers (cubin,
// fatbin, the __fatBinC_Wrapper_t nvcc embeds in host objects, or NUL-terminated PTX).
std::optional<std::size_t> image_extent(const void* image) {
  constexpr std::size_t kUnbounded = ~std::size_t{0} >> 1;
  return module_image_extent(static_cast<const std::uint8_t*>(image), kUnbounded);
}

std::expected<std::shared_ptr<const CubinInfo>, CUresult> parse_image(const std::uint8_t* data,
                                                                      std::size_t size) {
  auto info = parse_module_image(data, size, kDeviceSm);
  if (!info) return std::unexpected(info.error());
  return std::make_shared<const CubinInfo>(std::move(*info));
}

std::expected<std::shared_ptr<const CubinInfo>, CUresult> parse_unsized(const void* image) {
  if (image == nullptr) return std::unexpected(CUDA_ERROR_INVALID_VALUE);
  if (auto n = image_extent(image)) {
    return parse_image(static_cast<const std::uint8_t*>(image), *n);
  }
  return std::unexpected(CUDA_ERROR_INVALID_IMAGE);
}

std::expected<std::shared_ptr<const CubinInfo>, CUresult> parse_file(const char* path) {
  if (path == nullptr) return std::unexpected(CUDA_ERROR_INVALID_VALUE);
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::unexpected(CUDA_ERROR_FILE_NOT_FOUND);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  if (bytes.empty()) return std::unexpected(CUDA_ERROR_INVALID_IMAGE);
  bytes.push_back(0);  // PTX text is read up to its NUL
  return parse_image(bytes.data(), bytes.size());
}

void resolve(Function& f) {
  if (f.loaded) return;
  f.loaded = true;
  f.twin = find_twin(f.info().name);
}

// Makes a module of `image` in `ctx` (caller holds driver().mu).
CUresult create_module_locked(Context& ctx, std::shared_ptr<const CubinInfo> image,
                              std::uint64_t library, std::uint64_t* out, Call& c) {
  auto& t = module_tables();
  auto m = std::make_shared<Module>();
  m->ctx = ctx.handle;
  m->library = library;
  m->image = image;
  // __device__ and __constant__ variables live in device memory for the module's life.
  for (const auto& g : image->globals) {
    CUdeviceptr p = 0;
    std::uint64_t size = std::max<std::uint64_t>(g.size, 1);
    if (CUresult r = legacy_alloc(&p, size, ctx, c); r != CUDA_SUCCESS) {
      for (auto a : m->allocations) legacy_free(a);
      return r;
    }
    std::memset(reinterpret_cast<void*>(p), 0, size);
    if (!g.init.empty()) {  // zero-initialised variables have no bytes in the image
      std::memcpy(reinterpret_cast<void*>(p), g.init.data(),
                  std::min<std::size_t>(g.init.size(), size));
    }
    m->allocations.push_back(p);
    m->globals[g.name] = DeviceGlobal{p, g.size};
  }
  m->handle = t.modules.add(m);
  for (std::size_t i = 0; i < image->kernels.size(); ++i) {
    auto f = std::make_shared<Function>();
    f->module = m->handle;
    f->index = i;
    f->image = image;
    unsigned section = image->kernels[i].shared_bytes;
    unsigned reserved = image->sm >= 80 ? kReservedSharedPerBlock : 0;
    f->static_shared = static_cast<int>(section > reserved ? section - reserved : 0);
    f->max_dynamic_shared = 48 * 1024 - f->static_shared;
    f->handle = t.functions.add(f);
    if (!lazy_loading()) resolve(*f);
    m->functions.push_back(f->handle);
  }
  *out = m->handle;
  return CUDA_SUCCESS;
}

void destroy_module_locked(std::uint64_t handle) {
  auto& t = module_tables();
  auto m = t.modules.remove(handle);
  if (!m) return;
  for (auto f : m->functions) t.functions.remove(f);
  for (auto a : m->allocations) legacy_free(a);
}

CUresult load_module(CUmodule* module,
                     const std::expected<std::shared_ptr<const CubinInfo>, CUresult>& image,
                     Call& c) {
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto ctx = current_context_locked();
  if (!ctx) return ctx.error();
  if (!image) return image.error();
  std::uint64_t h = 0;
  if (CUresult r = create_module_locked(**ctx, *image, 0, &h, c); r != CUDA_SUCCESS) return r;
  *module = to_handle<CUmodule>(h);
  c.out_ptr("module", h).out("kernels", (*image)->kernels.size());
  return CUDA_SUCCESS;
}

}  // namespace

// Resolves a CUfunction (or a CUkernel passed as one, which CUDA 12 allows) for a
// launch in the current context. Caller holds driver().mu.
std::expected<std::shared_ptr<Function>, CUresult> emu::function_for_launch_locked(
    std::uint64_t handle, Context& ctx, Call& c) {
  auto& t = module_tables();
  std::shared_ptr<Function> f;
  if (has_tag(handle, HandleTag::kKernel)) {
    auto k = t.kernels.find(handle);
    if (!k) return std::unexpected(CUDA_ERROR_INVALID_HANDLE);
    auto lib = t.libraries.find(k->library);
    if (!lib) return std::unexpected(CUDA_ERROR_INVALID_HANDLE);
    auto& mh = lib->module_of_ctx[ctx.handle];
    if (mh == 0 || !t.modules.find(mh)) {
      if (CUresult r = create_module_locked(ctx, lib->image, lib->handle, &mh, c);
          r != CUDA_SUCCESS) {
        return std::unexpected(r);
      }
    }
    f = t.functions.find(t.modules.find(mh)->functions[k->index]);
  } else {
    f = t.functions.find(handle);
  }
  if (!f) return std::unexpected(CUDA_ERROR_INVALID_HANDLE);
  auto m = t.modules.find(f->module);
  if (!m) return std::unexpected(CUDA_ERROR_INVALID_HANDLE);
  // A module belongs to the context it was loaded in.
  if (m->ctx != ctx.handle) return std::unexpected(CUDA_ERROR_INVALID_CONTEXT);
  resolve(*f);
  return f;
}

void emu::unload_context_modules_locked(Context& ctx) {
  auto& t = module_tables();
  std::vector<std::uint64_t> doomed;
  for (auto& [h, m] : t.modules.items()) {
    if (m->ctx == ctx.handle) doomed.push_back(h);
  }
  for (auto h : doomed) destroy_module_locked(h);
}

EMU_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return api("cuModuleLoad", [&](Call& c) {
    c.arg("fname", fname);
    EMU_REQUIRE_INIT();
    return load_module(module, parse_file(fname), c);
  });
}

EMU_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return api("cuModuleLoadData", [&](Call& c) {
    EMU_REQUIRE_INIT();
    return load_module(module, parse_unsized(image), c);
  });
}

EMU_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                       CUjit_option* options, void** optionValues) {
  return api("cuModuleLoadDataEx", [&](Call& c) {
    c.arg("options", numOptions);
    EMU_REQUIRE_INIT();
    // JIT options only matter for PTX, which the emulator cannot compile.
    if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return load_module(module, parse_unsized(image), c);
  });
}

EMU_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return api("cuModuleLoadFatBinary", [&](Call& c) {
    EMU_REQUIRE_INIT();
    return load_module(module, parse_unsized(fatCubin), c);
  });
}

EMU_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  return api("cuModuleUnload", [&](Call& c) {
    c.ptr("module", handle_value(hmod));
    EMU_REQUIRE_INIT();
    std::lock_guard lock(driver().mu);
    auto m = module_tables().modules.find(handle_value(hmod));
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    // "a module which was obtained from the Library Management API" is the library's.
    if (m->library != 0) return CUDA_ERROR_NOT_PERMITTED;
    destroy_module_locked(m->handle);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  return api("cuModuleGetFunction", [&](Call& c) {
    c.ptr("module", handle_value(hmod)).arg("name", name);
    EMU_REQUIRE_INIT();
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto m = module_tables().modules.find(handle_value(hmod));
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    for (std::size_t i = 0; i < m->image->kernels.size(); ++i) {
      if (m->image->kernels[i].name == name) {
        // Under lazy loading, getting a function is what loads it (CUDA programming guide);
        // only enumerated handles stay unloaded until first use.
        resolve(*module_tables().functions.find(m->functions[i]));
        *hfunc = to_handle<CUfunction>(m->functions[i]);
        c.out_ptr("function", m->functions[i]);
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_NOT_FOUND;
  });
}

EMU_EXPORT CUresult cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
  return api("cuModuleGetFunctionCount", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto m = module_tables().modules.find(handle_value(mod));
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    *count = static_cast<unsigned>(m->functions.size());
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuModuleEnumerateFunctions(CUfunction* functions, unsigned int numFunctions,
                                               CUmodule mod) {
  return api("cuModuleEnumerateFunctions", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (functions == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto m = module_tables().modules.find(handle_value(mod));
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    // "a maximum number of numFunctions function handles"
    for (std::size_t i = 0; i < std::min<std::size_t>(numFunctions, m->functions.size()); ++i) {
      functions[i] = to_handle<CUfunction>(m->functions[i]);
    }
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                         const char* name) {
  return api("cuModuleGetGlobal", [&](Call& c) {
    c.arg("name", name);
    EMU_REQUIRE_INIT();
    // "One of the parameters dptr or bytes (not both) can be NULL".
    if (name == nullptr || (dptr == nullptr && bytes == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto m = module_tables().modules.find(handle_value(hmod));
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    auto it = m->globals.find(name);
    if (it == m->globals.end()) return CUDA_ERROR_NOT_FOUND;
    if (dptr != nullptr) *dptr = it->second.ptr;
    if (bytes != nullptr) *bytes = it->second.size;
    return CUDA_SUCCESS;
  });
}

// --- functions ---

namespace {
template <class F>
CUresult with_function(CUfunction h, F&& body) {
  EMU_REQUIRE_INIT();
  if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto f = module_tables().functions.find(handle_value(h));
  if (!f || !module_tables().modules.find(f->module)) return CUDA_ERROR_INVALID_HANDLE;
  return body(*f);
}
}  // namespace

EMU_EXPORT CUresult cuFuncGetName(const char** name, CUfunction hfunc) {
  return api("cuFuncGetName", [&](Call&) {
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_function(hfunc, [&](Function& f) {
      *name = f.info().name.c_str();
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                       size_t* paramSize) {
  return api("cuFuncGetParamInfo", [&](Call& c) {
    c.arg("index", paramIndex);
    if (paramOffset == nullptr && paramSize == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_function(func, [&](Function& f) {
      const auto& params = f.info().params;
      if (paramIndex >= params.size()) return CUDA_ERROR_INVALID_VALUE;
      if (paramOffset != nullptr) *paramOffset = params[paramIndex].offset;
      if (paramSize != nullptr) *paramSize = params[paramIndex].size;
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  return api("cuFuncGetModule", [&](Call&) {
    if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_function(hfunc, [&](Function& f) {
      *hmod = to_handle<CUmodule>(f.module);
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  return api("cuFuncIsLoaded", [&](Call&) {
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_function(function, [&](Function& f) {
      *state = f.loaded ? CU_FUNCTION_LOADING_STATE_LOADED : CU_FUNCTION_LOADING_STATE_UNLOADED;
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuFuncLoad(CUfunction function) {
  return api("cuFuncLoad", [&](Call&) {
    return with_function(function, [&](Function& f) {
      resolve(f);
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  return api("cuFuncGetAttribute", [&](Call& c) {
    c.arg("attrib", attrib);
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_function(hfunc, [&](Function& f) {
      const KernelInfo& k = f.info();
      // These need the function loaded (documented CUDA_ERROR_FUNCTION_NOT_LOADED).
      int a = raw(attrib);
      if (!f.loaded && (a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ||
                        a == CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES ||
                        a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)) {
        return CUDA_ERROR_FUNCTION_NOT_LOADED;
      }
      switch (a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
          *pi = k.max_threads != 0 ? static_cast<int>(k.max_threads) : 1024;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
          *pi = f.static_shared;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
        case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA:
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
          *pi = f.attributes.contains(raw(attrib)) ? f.attributes[raw(attrib)] : 0;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_NUM_REGS:
          *pi = static_cast<int>(k.num_regs);
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION:
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
          *pi = f.image->sm;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
          *pi = f.max_dynamic_shared;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
          *pi = f.preferred_carveout;
          return CUDA_SUCCESS;
        default:
          return CUDA_ERROR_INVALID_VALUE;
      }
    });
  });
}

EMU_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  return api("cuFuncSetAttribute", [&](Call& c) {
    c.arg("attrib", attrib).arg("value", value);
    return with_function(hfunc, [&](Function& f) {
      switch (raw(attrib)) {
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
          if (value < 0 || value + f.static_shared > kMaxSharedPerBlockOptin) {
            return CUDA_ERROR_INVALID_VALUE;
          }
          f.max_dynamic_shared = value;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
          if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
          f.preferred_carveout = value;
          return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
          if (value < 0) return CUDA_ERROR_INVALID_VALUE;
          f.attributes[raw(attrib)] = value;
          return CUDA_SUCCESS;
        default:  // read-only attributes
          return CUDA_ERROR_INVALID_VALUE;
      }
    });
  });
}

EMU_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return api("cuFuncSetCacheConfig", [&](Call&) {
    int v = raw(config);
    if (v < CU_FUNC_CACHE_PREFER_NONE || v > CU_FUNC_CACHE_PREFER_EQUAL) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return with_function(hfunc, [&](Function&) { return CUDA_SUCCESS; });
  });
}

// --- libraries (context-independent modules, CUDA 12) ---

namespace {

CUresult load_library(CUlibrary* library,
                      const std::expected<std::shared_ptr<const CubinInfo>, CUresult>& image,
                      unsigned numJitOptions, unsigned numLibraryOptions, const void* jitOptions,
                      const void* libraryOptions, Call& c) {
  EMU_REQUIRE_INIT();
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((numJitOptions > 0 && jitOptions == nullptr) ||
      (numLibraryOptions > 0 && libraryOptions == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!image) return image.error();
  std::lock_guard lock(driver().mu);
  auto& t = module_tables();
  auto lib = std::make_shared<Library>();
  lib->image = *image;
  lib->handle = t.libraries.add(lib);
  for (std::size_t i = 0; i < (*image)->kernels.size(); ++i) {
    auto k = std::make_shared<Kernel>();
    k->library = lib->handle;
    k->index = i;
    k->handle = t.kernels.add(k);
    lib->kernels.push_back(k->handle);
  }
  *library = to_handle<CUlibrary>(lib->handle);
  c.out_ptr("library", lib->handle);
  return CUDA_SUCCESS;
}

template <class F>
CUresult with_library(CUlibrary h, F&& body) {
  EMU_REQUIRE_INIT();
  std::lock_guard lock(driver().mu);
  auto lib = module_tables().libraries.find(handle_value(h));
  if (!lib) return CUDA_ERROR_INVALID_HANDLE;
  return body(*lib);
}

}  // namespace

EMU_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code,
                                      CUjit_option* jitOptions, void** jitOptionsValues,
                                      unsigned int numJitOptions, CUlibraryOption* libraryOptions,
                                      void** libraryOptionValues, unsigned int numLibraryOptions) {
  return api("cuLibraryLoadData", [&](Call& c) {
    (void)jitOptionsValues;
    (void)libraryOptionValues;
    if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    return load_library(library, parse_unsized(code), numJitOptions, numLibraryOptions, jitOptions,
                        libraryOptions, c);
  });
}

EMU_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName,
                                          CUjit_option* jitOptions, void** jitOptionsValues,
                                          unsigned int numJitOptions,
                                          CUlibraryOption* libraryOptions,
                                          void** libraryOptionValues,
                                          unsigned int numLibraryOptions) {
  return api("cuLibraryLoadFromFile", [&](Call& c) {
    c.arg("file", fileName);
    (void)jitOptionsValues;
    (void)libraryOptionValues;
    if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    return load_library(library, parse_file(fileName), numJitOptions, numLibraryOptions, jitOptions,
                        libraryOptions, c);
  });
}

EMU_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  return api("cuLibraryUnload", [&](Call&) {
    return with_library(library, [&](Library& lib) {
      auto& t = module_tables();
      for (auto& [ctx, m] : lib.module_of_ctx) destroy_module_locked(m);
      for (auto k : lib.kernels) t.kernels.remove(k);
      t.libraries.remove(lib.handle);
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  return api("cuLibraryGetKernel", [&](Call& c) {
    c.arg("name", name);
    if (pKernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_library(library, [&](Library& lib) {
      for (std::size_t i = 0; i < lib.image->kernels.size(); ++i) {
        if (lib.image->kernels[i].name == name) {
          *pKernel = to_handle<CUkernel>(lib.kernels[i]);
          return CUDA_SUCCESS;
        }
      }
      return CUDA_ERROR_NOT_FOUND;
    });
  });
}

EMU_EXPORT CUresult cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) {
  return api("cuLibraryGetKernelCount", [&](Call&) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_library(lib, [&](Library& l) {
      *count = static_cast<unsigned>(l.kernels.size());
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int numKernels,
                                              CUlibrary lib) {
  return api("cuLibraryEnumerateKernels", [&](Call&) {
    if (kernels == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_library(lib, [&](Library& l) {
      for (std::size_t i = 0; i < std::min<std::size_t>(numKernels, l.kernels.size()); ++i) {
        kernels[i] = to_handle<CUkernel>(l.kernels[i]);
      }
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuLibraryGetModule(CUmodule* pMod, CUlibrary library) {
  return api("cuLibraryGetModule", [&](Call& c) {
    if (pMod == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return with_library(library, [&](Library& lib) {
      auto ctx = current_context_locked();
      if (!ctx) return ctx.error();
      auto& t = module_tables();
      auto& mh = lib.module_of_ctx[(*ctx)->handle];
      if (mh == 0 || !t.modules.find(mh)) {
        if (CUresult r = create_module_locked(**ctx, lib.image, lib.handle, &mh, c);
            r != CUDA_SUCCESS) {
          return r;
        }
      }
      *pMod = to_handle<CUmodule>(mh);
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  return api("cuKernelGetFunction", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    if (!module_tables().kernels.find(handle_value(kernel))) return CUDA_ERROR_INVALID_HANDLE;
    auto ctx = current_context_locked();
    if (!ctx) return ctx.error();
    auto f = function_for_launch_locked(handle_value(kernel), **ctx, c);
    if (!f) return f.error();
    *pFunc = to_handle<CUfunction>((*f)->handle);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuKernelGetName(const char** name, CUkernel hfunc) {
  return api("cuKernelGetName", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (name == nullptr || hfunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto& t = module_tables();
    auto k = t.kernels.find(handle_value(hfunc));
    if (!k) return CUDA_ERROR_INVALID_HANDLE;
    auto lib = t.libraries.find(k->library);
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    *name = lib->image->kernels[k->index].name.c_str();
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset,
                                         size_t* paramSize) {
  return api("cuKernelGetParamInfo", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (paramOffset == nullptr && paramSize == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto& t = module_tables();
    auto k = t.kernels.find(handle_value(kernel));
    if (!k) return CUDA_ERROR_INVALID_HANDLE;
    auto lib = t.libraries.find(k->library);
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    const auto& params = lib->image->kernels[k->index].params;
    if (paramIndex >= params.size()) return CUDA_ERROR_INVALID_VALUE;
    if (paramOffset != nullptr) *paramOffset = params[paramIndex].offset;
    if (paramSize != nullptr) *paramSize = params[paramIndex].size;
    return CUDA_SUCCESS;
  });
}
