// Hooks of module and library loading: after the driver accepted an image, the graph recorder
// learns its digest per CUmodule / CUlibrary, so that a recorded kernel can name the image it
// came from (preload/artifact/graph_recorder.hpp), and the graph restore learns the handle per
// digest, so that a restored kernel is found in this run's load of the same image
// (preload/restore/graph_restore.hpp). The calls pass to the driver unchanged and
// its answer is the engine's; an image is read only after the driver has read it, and only
// while graphs are recorded (the deterministic layout is on).
#include <cuda.h>

#include <optional>
#include <type_traits>

#include "preload/artifact/module_image.hpp"
#include "preload/interpose/hook_table.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

using namespace thaw::preload;

namespace {

// The recorder, when a load that succeeded is to be recorded (the guard held by the caller).
GraphRecorder* recorder_for(CUresult r, const void* handle) {
  if (r != CUDA_SUCCESS || handle == nullptr || config().disabled) return nullptr;
  return runtime().graph_recorder();
}

std::optional<thaw::graphs::RecordedModule> in_memory(const void* image) {
  auto bytes = image_in_memory(image);
  if (!bytes) {
    debug("a module image of an unknown kind was loaded: its kernels cannot be recorded");
    return std::nullopt;
  }
  return recorded_module(*bytes);
}

template <typename Handle>
void note(GraphRecorder& graphs, Handle handle,
          const std::optional<thaw::graphs::RecordedModule>& image, const char* what) {
  if (!image) return;
  if constexpr (std::is_same_v<Handle, CUmodule>) {
    graphs.module_loaded(handle, *image);
    runtime().graph_restore().module_loaded(handle, image->digest);
  } else {
    graphs.library_loaded(handle, *image);
    runtime().graph_restore().library_loaded(handle, image->digest);
  }
  debug("{}: {} image of {} bytes, sha256 {}", what, thaw::graphs::to_string(image->kind),
        image->bytes, image->digest);
}

template <typename Handle>
CUresult loaded_from_memory(CUresult r, Handle* handle, const void* image, const char* what) {
  if (r != CUDA_SUCCESS || handle == nullptr || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  if (GraphRecorder* graphs = recorder_for(r, *handle))
    note(*graphs, *handle, in_memory(image), what);
  return r;
}

template <typename Handle>
CUresult loaded_from_file(CUresult r, Handle* handle, const char* path, const char* what) {
  if (r != CUDA_SUCCESS || handle == nullptr || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  GraphRecorder* graphs = recorder_for(r, *handle);
  if (graphs == nullptr) return r;
  auto image = file_module(path);
  if (!image) debug("{}: {} could not be read: its kernels cannot be recorded", what, path);
  note(*graphs, *handle, image, what);
  return r;
}

}  // namespace

extern "C" {

CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  auto fn = real<decltype(&cuModuleLoad)>(Hook::module_load);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return loaded_from_file(fn(module, fname), module, fname, "cuModuleLoad");
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  auto fn = real<decltype(&cuModuleLoadData)>(Hook::module_load_data);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return loaded_from_memory(fn(module, image), module, image, "cuModuleLoadData");
}

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int num_options,
                            CUjit_option* options, void** option_values) {
  auto fn = real<decltype(&cuModuleLoadDataEx)>(Hook::module_load_data_ex);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return loaded_from_memory(fn(module, image, num_options, options, option_values), module, image,
                            "cuModuleLoadDataEx");
}

CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fat_cubin) {
  auto fn = real<decltype(&cuModuleLoadFatBinary)>(Hook::module_load_fat_binary);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return loaded_from_memory(fn(module, fat_cubin), module, fat_cubin, "cuModuleLoadFatBinary");
}

CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                           void** jit_option_values, unsigned int num_jit_options,
                           CUlibraryOption* library_options, void** library_option_values,
                           unsigned int num_library_options) {
  auto fn = real<decltype(&cuLibraryLoadData)>(Hook::library_load_data);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return loaded_from_memory(fn(library, code, jit_options, jit_option_values, num_jit_options,
                               library_options, library_option_values, num_library_options),
                            library, code, "cuLibraryLoadData");
}

CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* file_name, CUjit_option* jit_options,
                               void** jit_option_values, unsigned int num_jit_options,
                               CUlibraryOption* library_options, void** library_option_values,
                               unsigned int num_library_options) {
  auto fn = real<decltype(&cuLibraryLoadFromFile)>(Hook::library_load_from_file);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return loaded_from_file(fn(library, file_name, jit_options, jit_option_values, num_jit_options,
                             library_options, library_option_values, num_library_options),
                          library, file_name, "cuLibraryLoadFromFile");
}

}  // extern "C"
