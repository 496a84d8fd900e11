#include "driver.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace refengine {

#ifdef REFENGINE_LINK_DRIVER

Driver::Driver() : source_("linked") {
  // cuda.h's macros map each base name to its current ABI (and, with
  // CUDA_API_PER_THREAD_DEFAULT_STREAM, to the _ptsz/_ptds variant): the linker binds them.
#define REFENGINE_DRIVER_LINK(member, sym) member = &::sym;
  REFENGINE_DRIVER_FUNCTIONS(REFENGINE_DRIVER_LINK)
#undef REFENGINE_DRIVER_LINK
}

Driver::~Driver() = default;

#else

namespace {
using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
}

Driver::Driver() {
  const char* path = std::getenv("REFENGINE_LIBCUDA");
  if (path == nullptr || *path == '\0') path = "libcuda.so.1";
  source_ = path;
  handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(std::string("cannot load the CUDA driver ") + path + ": " +
                             (why ? why : "unknown error"));
  }
  auto get = reinterpret_cast<GetProcAddress>(dlsym(handle_, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    dlclose(handle_);
    handle_ = nullptr;
    throw std::runtime_error(std::string("the CUDA driver ") + path +
                             " has no cuGetProcAddress_v2 (a CUDA 12 driver is required)");
  }
  auto resolve = [&](const char* name, void** out) {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r =
        get(name, out, kCudaVersion, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || *out == nullptr) {
      throw std::runtime_error(std::string("the CUDA driver ") + path + " does not provide " +
                               name + " for CUDA " + std::to_string(kCudaVersion) + " (result " +
                               std::to_string(r) + ", status " + std::to_string(status) + ")");
    }
  };
  try {
#define REFENGINE_DRIVER_RESOLVE(member, sym) resolve(#sym, reinterpret_cast<void**>(&member));
    REFENGINE_DRIVER_FUNCTIONS(REFENGINE_DRIVER_RESOLVE)
#undef REFENGINE_DRIVER_RESOLVE
  } catch (...) {
    dlclose(handle_);
    handle_ = nullptr;
    throw;
  }
}

// The driver stays loaded for the life of the process, as the CUDA runtime keeps it: its
// threads and atexit handlers may outlive this object.
Driver::~Driver() = default;

#endif

void* Driver::extension(const char* name) const {
  if (void* found = dlsym(RTLD_DEFAULT, name)) return found;
  return handle_ != nullptr ? dlsym(handle_, name) : nullptr;
}

std::string Driver::error_message(CUresult r, std::string_view what) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name == nullptr || get_error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (get_error_string == nullptr || get_error_string(r, &text) != CUDA_SUCCESS) text = nullptr;
  std::string out(what);
  out += ": ";
  out += name ? name : ("CUresult " + std::to_string(static_cast<int>(r)));
  if (r != CUDA_SUCCESS && text != nullptr) {
    out += " (";
    out += text;
    out += ")";
  }
  return out;
}

void Driver::check(CUresult r, std::string_view what) const {
  if (r != CUDA_SUCCESS) throw DriverError(r, error_message(r, what));
}

}  // namespace refengine
