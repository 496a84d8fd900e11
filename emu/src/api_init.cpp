// Initialisation, devices, error strings.
#include <dlfcn.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "api_common.hpp"
#include "device.hpp"
#include "errors.hpp"

// The original (v1) entry points are exported under their plain names, which cuda.h
// maps to the newest variant: undo that here.
#undef cuDeviceGetUuid

using namespace emu;

namespace {

// A real driver looks up symbols with dlsym while it initialises, its own included. A library
// that overrides dlsym to hand out hooks (HAMi-core, thaw's shim) sees those lookups too; if it
// answers one with a hook, the driver's internal path calls back into the interposer, which
// calls the driver: recursion, or a hook where the driver expected itself. The emulator makes
// the same kind of lookup, of names interposers do hook, through a handle to itself (where
// plain glibc can only find this library's definitions), and refuses to initialise when an
// answer lies anywhere else. Returns why it refuses, or nothing.
constexpr const char* kSelfLookups[] = {"cuGetProcAddress_v2", "cuMemAlloc_v2"};

std::optional<std::string> self_lookup_refusal() {
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&self_lookup_refusal), &self) == 0 ||
      self.dli_fname == nullptr) {
    return "dladdr cannot find the driver library itself";
  }
  void* handle = ::dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return fmt::format("dlopen('{}', RTLD_NOLOAD) of itself failed: {}", self.dli_fname,
                       why != nullptr ? why : "unknown error");
  }
  std::optional<std::string> refusal;
  for (const char* name : kSelfLookups) {
    void* found = ::dlsym(handle, name);
    Dl_info where{};
    if (found != nullptr && ::dladdr(found, &where) != 0 && where.dli_fbase == self.dli_fbase) {
      continue;
    }
    refusal = fmt::format(
        "its internal dlsym(<{}>, \"{}\") answered {} in {}, not its own function: a library "
        "that overrides dlsym handed the driver's own lookup something else",
        self.dli_fname, name, found, where.dli_fname != nullptr ? where.dli_fname : "no library");
    break;
  }
  ::dlclose(handle);
  return refusal;
}

}  // namespace

EMU_EXPORT CUresult cuInit(unsigned int flags) {
  return api("cuInit", [&](Call& c) {
    c.arg("flags", flags);
    if (!driver().initialized()) {
      if (auto refusal = self_lookup_refusal()) {
        std::fprintf(stderr, "thaw-emu: cuInit failed: %s\n", refusal->c_str());
        return CUDA_ERROR_NOT_INITIALIZED;
      }
    }
    return driver().init(flags);
  });
}

EMU_EXPORT CUresult cuDriverGetVersion(int* version) {
  return api("cuDriverGetVersion", [&](Call&) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = kDriverVersion;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuDeviceGetCount(int* count) {
  return api("cuDeviceGetCount", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = driver().device_count();
    c.out("count", *count);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  return api("cuDeviceGet", [&](Call& c) {
    c.arg("ordinal", ordinal);
    EMU_REQUIRE_INIT();
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  return api("cuDeviceGetName", [&](Call& c) {
    c.arg("dev", dev);
    EMU_REQUIRE_INIT();
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    const std::string& n = driver().device(dev).name;
    std::size_t k = std::min<std::size_t>(n.size(), static_cast<std::size_t>(len) - 1);
    std::memcpy(name, n.data(), k);
    name[k] = '\0';
    return CUDA_SUCCESS;
  });
}

static CUresult device_uuid(const char* name, CUuuid* uuid, CUdevice dev) {
  return api(name, [&](Call& c) {
    c.arg("dev", dev);
    EMU_REQUIRE_INIT();
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *uuid = driver().device(dev).uuid;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return device_uuid("cuDeviceGetUuid", uuid, dev);
}
EMU_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return device_uuid("cuDeviceGetUuid", uuid, dev);
}

EMU_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return api("cuDeviceTotalMem", [&](Call& c) {
    c.arg("dev", dev);
    EMU_REQUIRE_INIT();
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = driver().device(dev).capacity;
    c.out("bytes", *bytes);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return api("cuDeviceGetAttribute", [&](Call& c) {
    c.arg("attrib", attrib).arg("dev", dev);
    EMU_REQUIRE_INIT();
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    auto v = device_attribute(raw(attrib), dev);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *pi = *v;
    c.out("value", *pi);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return api("cuDeviceGetPCIBusId", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int bus = *device_attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    std::snprintf(pciBusId, static_cast<std::size_t>(len), "00000000:%02X:00.0", bus);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
  return api("cuGetErrorName", [&](Call&) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto t = error_text(raw(error));
    *pStr = t ? t->name : nullptr;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

EMU_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
  return api("cuGetErrorString", [&](Call&) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto t = error_text(raw(error));
    *pStr = t ? t->message : nullptr;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

// NVIDIA's runtime asks for private tables by UUID. No emulator can provide them: answer
// with an error (the runtime then fails cleanly) rather than a pointer it would crash on.
EMU_EXPORT CUresult cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  return api("cuGetExportTable", [&](Call&) {
    if (ppExportTable != nullptr) *ppExportTable = nullptr;
    if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}
