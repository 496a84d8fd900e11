// Multicast objects (cuda.h, "Multicast Object Management"). Multicast needs NVLink SHARP (an
// NVSwitch system); the emulated device reports CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0, and
// on such a device the real driver answers every multicast call CUDA_ERROR_NOT_SUPPORTED, after the
// argument checks. The entry points exist because PyTorch looks them up (c10/cuda/driver_api.h,
// optional, version 12030) and checks the attribute before it calls them.
#include "api_common.hpp"

using namespace emu;

EMU_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle* mcHandle,
                                      const CUmulticastObjectProp* prop) {
  return api("cuMulticastCreate", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (mcHandle == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

EMU_EXPORT CUresult cuMulticastGetGranularity(size_t* granularity,
                                              const CUmulticastObjectProp* prop,
                                              CUmulticastGranularity_flags option) {
  return api("cuMulticastGetGranularity", [&](Call& c) {
    c.arg("option", raw(option));
    EMU_REQUIRE_INIT();
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

EMU_EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev) {
  return api("cuMulticastAddDevice", [&](Call& c) {
    c.arg("mc", mcHandle).arg("dev", dev);
    EMU_REQUIRE_INIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

EMU_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                       CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                       size_t size, unsigned long long flags) {
  return api("cuMulticastBindMem", [&](Call& c) {
    c.arg("mc", mcHandle).arg("mc_offset", mcOffset).arg("mem", memHandle);
    c.arg("mem_offset", memOffset).arg("size", size).arg("flags", flags);
    EMU_REQUIRE_INIT();
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

EMU_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                        CUdeviceptr memptr, size_t size, unsigned long long flags) {
  return api("cuMulticastBindAddr", [&](Call& c) {
    c.arg("mc", mcHandle).arg("mc_offset", mcOffset).ptr("memptr", memptr);
    c.arg("size", size).arg("flags", flags);
    EMU_REQUIRE_INIT();
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

EMU_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                      size_t mcOffset, size_t size) {
  return api("cuMulticastUnbind", [&](Call& c) {
    c.arg("mc", mcHandle).arg("dev", dev).arg("mc_offset", mcOffset).arg("size", size);
    EMU_REQUIRE_INIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}
