// Entry-point lookup (cuGetProcAddress, cuGetProcAddress_v2), error names and strings,
// and cuGetExportTable of the emulated CUDA driver.
//
// The CUDA runtime and PyTorch reach every driver function through cuGetProcAddress with
// an explicit CUDA version, so the ABI variant it returns for each version matters as much
// as the function itself: an older runtime handed a newer ABI crashes (HAMi-core's
// history, ../shared/CUDA-NOTES.md). The expected variants follow cudaTypedefs.h, whose
// PFN_<name>_v<version> typedefs say in which CUDA version each ABI appeared. Function
// pointers are compared with dlsym() of the exact exported names.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

void* Exported(const char* name) {
  return dlsym(RTLD_DEFAULT, name);
}

int DriverVersion() {
  int v = 0;
  EXPECT_EQ(cuDriverGetVersion(&v), CUDA_SUCCESS);
  return v;
}

struct Lookup {
  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult status = static_cast<CUdriverProcAddressQueryResult>(3);
  CUresult result = CUDA_ERROR_UNKNOWN;
};

Lookup Get(const char* symbol, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  Lookup l;
  l.result = cuGetProcAddress(symbol, &l.fn, version, flags, &l.status);
  return l;
}

// The 4-argument entry point of CUDA 11.3-11.8 runtimes. cuda.h renames cuGetProcAddress
// to cuGetProcAddress_v2, so it is reached by its exported name.
PFN_cuGetProcAddress_v11030 LegacyGetProcAddress() {
  return reinterpret_cast<PFN_cuGetProcAddress_v11030>(Exported("cuGetProcAddress"));
}

struct Expectation {
  const char* symbol;
  int version;
  const char* exported;  // the ABI variant cuGetProcAddress must return
};

std::string Describe(const Expectation& e, const char* flags = "") {
  return std::string(e.symbol) + " at " + std::to_string(e.version) + flags + " -> " + e.exported;
}

// Base names resolve to the newest ABI variant not newer than the requested version.
const Expectation kCurrentVariants[] = {
    {"cuInit", 2000, "cuInit"},
    {"cuInit", 13000, "cuInit"},
    {"cuDriverGetVersion", 13000, "cuDriverGetVersion"},
    {"cuDeviceGet", 13000, "cuDeviceGet"},
    {"cuDeviceGetAttribute", 13000, "cuDeviceGetAttribute"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuDeviceTotalMem", 13000, "cuDeviceTotalMem_v2"},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"},
    {"cuDeviceGetUuid", 13000, "cuDeviceGetUuid_v2"},
    {"cuDevicePrimaryCtxRetain", 13000, "cuDevicePrimaryCtxRetain"},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
    {"cuDevicePrimaryCtxSetFlags", 12000, "cuDevicePrimaryCtxSetFlags_v2"},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
    {"cuCtxCreate", 11030, "cuCtxCreate_v2"},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12040, "cuCtxCreate_v3"},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4"},
    {"cuCtxCreate", 13000, "cuCtxCreate_v4"},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 13000, "cuCtxPopCurrent_v2"},
    {"cuCtxSetCurrent", 13000, "cuCtxSetCurrent"},
    // CUDA 13 gave cuCtxSynchronize and cuCtxGetDevice a context argument (_v2).
    {"cuCtxSynchronize", 12080, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"},
    {"cuCtxGetDevice", 12080, "cuCtxGetDevice"},
    {"cuCtxGetDevice", 13000, "cuCtxGetDevice_v2"},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
    {"cuMemAlloc", 13000, "cuMemAlloc_v2"},
    {"cuMemFree", 13000, "cuMemFree_v2"},
    {"cuMemGetInfo", 13000, "cuMemGetInfo_v2"},
    {"cuMemGetAddressRange", 12000, "cuMemGetAddressRange_v2"},
    {"cuMemAllocHost", 12000, "cuMemAllocHost_v2"},
    {"cuMemHostAlloc", 12000, "cuMemHostAlloc"},
    {"cuMemHostGetDevicePointer", 12000, "cuMemHostGetDevicePointer_v2"},
    {"cuMemHostRegister", 6050, "cuMemHostRegister_v2"},
    {"cuMemHostRegister", 13000, "cuMemHostRegister_v2"},
    {"cuMemcpy", 13000, "cuMemcpy"},
    {"cuMemcpyAsync", 13000, "cuMemcpyAsync"},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", 13000, "cuMemcpyDtoH_v2"},
    {"cuMemcpyDtoD", 13000, "cuMemcpyDtoD_v2"},
    {"cuMemcpyHtoDAsync", 13000, "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoHAsync", 13000, "cuMemcpyDtoHAsync_v2"},
    {"cuMemcpyDtoDAsync", 13000, "cuMemcpyDtoDAsync_v2"},
    {"cuMemsetD8", 13000, "cuMemsetD8_v2"},
    {"cuMemsetD16", 13000, "cuMemsetD16_v2"},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2"},
    {"cuMemsetD32Async", 13000, "cuMemsetD32Async"},
    {"cuPointerGetAttribute", 13000, "cuPointerGetAttribute"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemMap", 13000, "cuMemMap"},
    {"cuStreamCreate", 13000, "cuStreamCreate"},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
    {"cuStreamSynchronize", 13000, "cuStreamSynchronize"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
    {"cuEventElapsedTime", 12080, "cuEventElapsedTime_v2"},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2"},
    {"cuGetErrorName", 13000, "cuGetErrorName"},
    {"cuGetProcAddress", 11030, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
    {"cuGetExportTable", 3000, "cuGetExportTable"},
};

TEST(ProcAddress, BaseNamesResolveToTheNewestVariantNotNewerThanTheVersion) {
  for (const auto& e : kCurrentVariants) {
    void* want = Exported(e.exported);
    ASSERT_NE(want, nullptr) << e.exported << " is not exported";
    const Lookup l = Get(e.symbol, e.version);
    EXPECT_EQ(l.result, CUDA_SUCCESS) << Describe(e);
    EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SUCCESS) << Describe(e);
    EXPECT_EQ(l.fn, want) << Describe(e);
  }
}

// Versions before a _v2 ABI existed must get the old ABI, never the new one ("Returning
// the newest ABI version regardless of cudaVersion broke older runtimes"). An emulator may
// leave an ancient ABI out; then the answer is NULL with VERSION_NOT_SUFFICIENT, never a
// function with another signature.
TEST(ProcAddress, OlderVersionsNeverGetANewerAbi) {
  const Expectation old_abis[] = {
      {"cuMemAlloc", 3010, "cuMemAlloc"},
      {"cuMemFree", 2000, "cuMemFree"},
      {"cuCtxCreate", 3010, "cuCtxCreate"},
      {"cuCtxDestroy", 3020, "cuCtxDestroy"},
      {"cuDeviceGetUuid", 11030, "cuDeviceGetUuid"},
      {"cuDevicePrimaryCtxRelease", 10020, "cuDevicePrimaryCtxRelease"},
      {"cuStreamDestroy", 3020, "cuStreamDestroy"},
      {"cuMemHostRegister", 6000, "cuMemHostRegister"},
      {"cuEventElapsedTime", 12060, "cuEventElapsedTime"},
      {"cuIpcOpenMemHandle", 10020, "cuIpcOpenMemHandle"},
  };
  for (const auto& e : old_abis) {
    const Lookup l = Get(e.symbol, e.version);
    EXPECT_EQ(l.result, CUDA_SUCCESS) << Describe(e);
    if (void* want = Exported(e.exported)) {
      EXPECT_EQ(l.fn, want) << Describe(e);
      EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SUCCESS) << Describe(e);
    } else {
      EXPECT_EQ(l.fn, nullptr) << Describe(e) << ": a newer ABI was returned";
      EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) << Describe(e);
    }
  }
}

// "If the specified CUDA version is greater than the driver version, the API will return
// CUDA_ERROR_INVALID_VALUE."
TEST(ProcAddress, VersionAboveTheDriversIsInvalidValue) {
  const int driver = DriverVersion();
  for (int version : {driver + 10, driver + 1000, INT_MAX}) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(cuGetProcAddress("cuMemAlloc", &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status),
              CUDA_ERROR_INVALID_VALUE)
        << version;
  }
  EXPECT_EQ(Get("cuMemAlloc", driver).result, CUDA_SUCCESS) << "the driver's own version";
}

// "The API will return CUDA_SUCCESS and set the returned pfn to NULL if ... the driver
// symbol is invalid"; symbolStatus "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND".
TEST(ProcAddress, UnknownSymbolsAreSuccessWithNullAndNotFound) {
  for (const char* symbol : {"cuDoesNotExist", "cudaMalloc", "cuMemAllocTypo", "malloc"}) {
    const Lookup l = Get(symbol, 13000);
    EXPECT_EQ(l.result, CUDA_SUCCESS) << symbol;
    EXPECT_EQ(l.fn, nullptr) << symbol;
    EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) << symbol;
  }
}

// "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT - The requested symbol was found but is not
// supported by cudaVersion specified", with pfn NULL and CUDA_SUCCESS ("no ABI compatible
// driver function exists for the specified cudaVersion").
TEST(ProcAddress, SymbolsNewerThanTheVersionAreVersionNotSufficient) {
  const std::pair<const char*, int> too_old[] = {
      {"cuMemCreate", 10010},          // VMM appeared in 10.2
      {"cuMemMap", 9020},              //
      {"cuMemAddressReserve", 10000},  //
      {"cuGetProcAddress", 11020},     // 11.3
      {"cuLaunchHostFunc", 9020},      // 10.0
      {"cuPointerGetAttributes", 6050},
  };
  for (const auto& [symbol, version] : too_old) {
    const Lookup l = Get(symbol, version);
    EXPECT_EQ(l.result, CUDA_SUCCESS) << symbol << " at " << version;
    EXPECT_EQ(l.fn, nullptr) << symbol << " at " << version;
    EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) << symbol << " at " << version;
  }
}

// symbolStatus is "Optional".
TEST(ProcAddress, StatusIsOptional) {
  void* fn = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, Exported("cuMemAlloc_v2"));
  fn = reinterpret_cast<void*>(0x1);
  ASSERT_EQ(cuGetProcAddress("cuDoesNotExist", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
}

TEST(ProcAddress, NullSymbolOrOutputIsInvalidValue) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  EXPECT_EQ(cuGetProcAddress(nullptr, &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetProcAddress("cuMemAlloc", nullptr, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_ERROR_INVALID_VALUE);
}

// The flags are CU_GET_PROC_ADDRESS_DEFAULT, _LEGACY_STREAM and
// _PER_THREAD_DEFAULT_STREAM; any other bit is not a flag.
TEST(ProcAddress, UnknownFlagsAreInvalidValue) {
  for (cuuint64_t flags :
       {cuuint64_t{4}, cuuint64_t{8}, cuuint64_t{1} << 20, cuuint64_t{1} << 63}) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(cuGetProcAddress("cuMemAlloc", &fn, 13000, flags, &status), CUDA_ERROR_INVALID_VALUE)
        << "flags " << flags;
  }
}

// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: "search for all driver symbols that match
// the requested driver symbol name including the per-thread versions. If a per-thread
// version is not found, the API will return the legacy version". The _ptds/_ptsz
// variants appeared in CUDA 7.0 (cudaTypedefs.h: PFN_*_v7000_ptsz/_ptds).
TEST(ProcAddress, PerThreadFlagSelectsPerThreadVariants) {
  const Expectation per_thread[] = {
      {"cuMemcpyHtoD", 13000, "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyDtoH", 13000, "cuMemcpyDtoH_v2_ptds"},
      {"cuMemcpyDtoD", 13000, "cuMemcpyDtoD_v2_ptds"},
      {"cuMemcpy", 13000, "cuMemcpy_ptds"},
      {"cuMemcpyHtoDAsync", 13000, "cuMemcpyHtoDAsync_v2_ptsz"},
      {"cuMemcpyDtoHAsync", 13000, "cuMemcpyDtoHAsync_v2_ptsz"},
      {"cuMemcpyDtoDAsync", 13000, "cuMemcpyDtoDAsync_v2_ptsz"},
      {"cuMemcpyAsync", 13000, "cuMemcpyAsync_ptsz"},
      {"cuMemsetD8", 13000, "cuMemsetD8_v2_ptds"},
      {"cuMemsetD16", 13000, "cuMemsetD16_v2_ptds"},
      {"cuMemsetD32", 13000, "cuMemsetD32_v2_ptds"},
      {"cuMemsetD8Async", 13000, "cuMemsetD8Async_ptsz"},
      {"cuMemsetD16Async", 13000, "cuMemsetD16Async_ptsz"},
      {"cuMemsetD32Async", 13000, "cuMemsetD32Async_ptsz"},
      {"cuStreamSynchronize", 13000, "cuStreamSynchronize_ptsz"},
      {"cuStreamQuery", 13000, "cuStreamQuery_ptsz"},
      {"cuStreamWaitEvent", 13000, "cuStreamWaitEvent_ptsz"},
      {"cuStreamAddCallback", 13000, "cuStreamAddCallback_ptsz"},
      {"cuLaunchHostFunc", 13000, "cuLaunchHostFunc_ptsz"},
      {"cuEventRecord", 13000, "cuEventRecord_ptsz"},
      // Functions without per-thread variants: the ordinary ones.
      {"cuMemAlloc", 13000, "cuMemAlloc_v2"},
      {"cuMemFree", 13000, "cuMemFree_v2"},
      {"cuCtxSynchronize", 12000, "cuCtxSynchronize"},
      {"cuStreamCreate", 13000, "cuStreamCreate"},
      {"cuEventCreate", 13000, "cuEventCreate"},
      {"cuMemCreate", 13000, "cuMemCreate"},
      {"cuInit", 13000, "cuInit"},
      // Before CUDA 7.0 there were no per-thread variants to find.
      {"cuStreamSynchronize", 6050, "cuStreamSynchronize"},
      {"cuMemcpyHtoD", 6050, "cuMemcpyHtoD_v2"},
  };
  for (const auto& e : per_thread) {
    void* want = Exported(e.exported);
    ASSERT_NE(want, nullptr) << e.exported << " is not exported";
    const Lookup l = Get(e.symbol, e.version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    EXPECT_EQ(l.result, CUDA_SUCCESS) << Describe(e, " per-thread");
    EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SUCCESS) << Describe(e, " per-thread");
    EXPECT_EQ(l.fn, want) << Describe(e, " per-thread");
  }
}

// CU_GET_PROC_ADDRESS_LEGACY_STREAM: "all driver symbols that match ... except the
// corresponding per-thread versions"; DEFAULT is legacy unless the caller was compiled
// for per-thread default streams (then cuda.h's inline wrapper adds the flag itself).
TEST(ProcAddress, LegacyAndDefaultFlagsSelectLegacyVariants) {
  const Expectation legacy[] = {
      {"cuMemcpyHtoDAsync", 13000, "cuMemcpyHtoDAsync_v2"},
      {"cuMemcpyHtoD", 13000, "cuMemcpyHtoD_v2"},
      {"cuStreamSynchronize", 13000, "cuStreamSynchronize"},
      {"cuMemsetD32Async", 13000, "cuMemsetD32Async"},
  };
  for (cuuint64_t flags :
       {cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM}, cuuint64_t{CU_GET_PROC_ADDRESS_DEFAULT}}) {
    for (const auto& e : legacy) {
      const Lookup l = Get(e.symbol, e.version, flags);
      EXPECT_EQ(l.result, CUDA_SUCCESS) << Describe(e) << " flags " << flags;
      EXPECT_EQ(l.fn, Exported(e.exported)) << Describe(e) << " flags " << flags;
    }
  }
}

TEST(ProcAddress, ReturnedFunctionsWork) {
  const Lookup version = Get("cuDriverGetVersion", 13000);
  ASSERT_NE(version.fn, nullptr);
  int v = 0;
  EXPECT_EQ(reinterpret_cast<PFN_cuDriverGetVersion_v2020>(version.fn)(&v), CUDA_SUCCESS);
  EXPECT_EQ(v, DriverVersion());
  const Lookup init = Get("cuInit", 13000);
  ASSERT_NE(init.fn, nullptr);
  EXPECT_EQ(reinterpret_cast<PFN_cuInit_v2000>(init.fn)(0), CUDA_SUCCESS);
  const Lookup count = Get("cuDeviceGetCount", 13000);
  ASSERT_NE(count.fn, nullptr);
  int n = 0;
  EXPECT_EQ(reinterpret_cast<PFN_cuDeviceGetCount_v2000>(count.fn)(&n), CUDA_SUCCESS);
  EXPECT_GE(n, 1);
}

// The CUDA 11.3-11.8 form: no symbolStatus, so a symbol it cannot return is an error,
// CUDA_ERROR_NOT_FOUND. (The 11.x runtime documents the same for its wrapper:
// cudaGetDriverEntryPoint "will return cudaErrorSymbolNotFound if the requested driver
// function is not supported on the platform, no ABI compatible driver function exists for
// the CUDA runtime version or if the driver symbol is invalid".)
TEST(ProcAddress, LegacyFourArgumentFormFollowsTheSameRules) {
  auto legacy = LegacyGetProcAddress();
  ASSERT_NE(legacy, nullptr) << "cuGetProcAddress (4 arguments) is not exported";
  void* fn = nullptr;
  ASSERT_EQ(legacy("cuMemAlloc", &fn, 11080, CU_GET_PROC_ADDRESS_DEFAULT), CUDA_SUCCESS);
  EXPECT_EQ(fn, Exported("cuMemAlloc_v2"));
  ASSERT_EQ(legacy("cuCtxCreate", &fn, 11040, CU_GET_PROC_ADDRESS_DEFAULT), CUDA_SUCCESS);
  EXPECT_EQ(fn, Exported("cuCtxCreate_v3"));
  ASSERT_EQ(legacy("cuCtxCreate", &fn, 11030, CU_GET_PROC_ADDRESS_DEFAULT), CUDA_SUCCESS);
  EXPECT_EQ(fn, Exported("cuCtxCreate_v2"));
  ASSERT_EQ(legacy("cuGetProcAddress", &fn, 11030, CU_GET_PROC_ADDRESS_DEFAULT), CUDA_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(legacy));
  ASSERT_EQ(
      legacy("cuStreamSynchronize", &fn, 11080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
      CUDA_SUCCESS);
  EXPECT_EQ(fn, Exported("cuStreamSynchronize_ptsz"));
  fn = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(legacy("cuDoesNotExist", &fn, 11080, CU_GET_PROC_ADDRESS_DEFAULT),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  fn = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(legacy("cuMemCreate", &fn, 10010, CU_GET_PROC_ADDRESS_DEFAULT), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(legacy("cuMemAlloc", &fn, DriverVersion() + 10, CU_GET_PROC_ADDRESS_DEFAULT),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(legacy("cuMemAlloc", &fn, 11080, 4), CUDA_ERROR_INVALID_VALUE);
}

// ---------------------------------------------------------------------------------------
// cuGetErrorName / cuGetErrorString
// ---------------------------------------------------------------------------------------

#define E(x) std::pair<CUresult, const char*>(x, #x)
// Every enumerator of CUresult in CUDA 13's cuda.h, in header order.
const std::pair<CUresult, const char*> kAllResults[] = {
    E(CUDA_SUCCESS),
    E(CUDA_ERROR_INVALID_VALUE),
    E(CUDA_ERROR_OUT_OF_MEMORY),
    E(CUDA_ERROR_NOT_INITIALIZED),
    E(CUDA_ERROR_DEINITIALIZED),
    E(CUDA_ERROR_PROFILER_DISABLED),
    E(CUDA_ERROR_PROFILER_NOT_INITIALIZED),
    E(CUDA_ERROR_PROFILER_ALREADY_STARTED),
    E(CUDA_ERROR_PROFILER_ALREADY_STOPPED),
    E(CUDA_ERROR_STUB_LIBRARY),
    E(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER),
    E(CUDA_ERROR_DEVICE_UNAVAILABLE),
    E(CUDA_ERROR_NO_DEVICE),
    E(CUDA_ERROR_INVALID_DEVICE),
    E(CUDA_ERROR_DEVICE_NOT_LICENSED),
    E(CUDA_ERROR_INVALID_IMAGE),
    E(CUDA_ERROR_INVALID_CONTEXT),
    E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT),
    E(CUDA_ERROR_MAP_FAILED),
    E(CUDA_ERROR_UNMAP_FAILED),
    E(CUDA_ERROR_ARRAY_IS_MAPPED),
    E(CUDA_ERROR_ALREADY_MAPPED),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU),
    E(CUDA_ERROR_ALREADY_ACQUIRED),
    E(CUDA_ERROR_NOT_MAPPED),
    E(CUDA_ERROR_NOT_MAPPED_AS_ARRAY),
    E(CUDA_ERROR_NOT_MAPPED_AS_POINTER),
    E(CUDA_ERROR_ECC_UNCORRECTABLE),
    E(CUDA_ERROR_UNSUPPORTED_LIMIT),
    E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE),
    E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
    E(CUDA_ERROR_INVALID_PTX),
    E(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT),
    E(CUDA_ERROR_NVLINK_UNCORRECTABLE),
    E(CUDA_ERROR_JIT_COMPILER_NOT_FOUND),
    E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
    E(CUDA_ERROR_JIT_COMPILATION_DISABLED),
    E(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY),
    E(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC),
    E(CUDA_ERROR_CONTAINED),
    E(CUDA_ERROR_INVALID_SOURCE),
    E(CUDA_ERROR_FILE_NOT_FOUND),
    E(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND),
    E(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED),
    E(CUDA_ERROR_OPERATING_SYSTEM),
    E(CUDA_ERROR_INVALID_HANDLE),
    E(CUDA_ERROR_ILLEGAL_STATE),
    E(CUDA_ERROR_LOSSY_QUERY),
    E(CUDA_ERROR_NOT_FOUND),
    E(CUDA_ERROR_NOT_READY),
    E(CUDA_ERROR_ILLEGAL_ADDRESS),
    E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    E(CUDA_ERROR_LAUNCH_TIMEOUT),
    E(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING),
    E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
    E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
    E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED),
    E(CUDA_ERROR_ASSERT),
    E(CUDA_ERROR_TOO_MANY_PEERS),
    E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
    E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
    E(CUDA_ERROR_HARDWARE_STACK_ERROR),
    E(CUDA_ERROR_ILLEGAL_INSTRUCTION),
    E(CUDA_ERROR_MISALIGNED_ADDRESS),
    E(CUDA_ERROR_INVALID_ADDRESS_SPACE),
    E(CUDA_ERROR_INVALID_PC),
    E(CUDA_ERROR_LAUNCH_FAILED),
    E(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
    E(CUDA_ERROR_TENSOR_MEMORY_LEAK),
    E(CUDA_ERROR_NOT_PERMITTED),
    E(CUDA_ERROR_NOT_SUPPORTED),
    E(CUDA_ERROR_SYSTEM_NOT_READY),
    E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH),
    E(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
    E(CUDA_ERROR_MPS_CONNECTION_FAILED),
    E(CUDA_ERROR_MPS_RPC_FAILURE),
    E(CUDA_ERROR_MPS_SERVER_NOT_READY),
    E(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED),
    E(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED),
    E(CUDA_ERROR_MPS_CLIENT_TERMINATED),
    E(CUDA_ERROR_CDP_NOT_SUPPORTED),
    E(CUDA_ERROR_CDP_VERSION_MISMATCH),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
    E(CUDA_ERROR_STREAM_CAPTURE_MERGE),
    E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED),
    E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
    E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
    E(CUDA_ERROR_CAPTURED_EVENT),
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
    E(CUDA_ERROR_TIMEOUT),
    E(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE),
    E(CUDA_ERROR_EXTERNAL_DEVICE),
    E(CUDA_ERROR_INVALID_CLUSTER_SIZE),
    E(CUDA_ERROR_FUNCTION_NOT_LOADED),
    E(CUDA_ERROR_INVALID_RESOURCE_TYPE),
    E(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION),
    E(CUDA_ERROR_KEY_ROTATION),
    E(CUDA_ERROR_UNKNOWN),
};
#undef E

TEST(ErrorText, TheListCoversTheWholeEnum) {
  // cuda.h's CUresult has 101 enumerators; a new header adds some and this list with them.
  EXPECT_EQ(std::size(kAllResults), 101u);
}

// cuGetErrorName: "a NULL-terminated string representation of the name of the enum error
// code".
TEST(ErrorText, EveryResultHasItsEnumName) {
  for (const auto& [code, name] : kAllResults) {
    const char* got = nullptr;
    ASSERT_EQ(cuGetErrorName(code, &got), CUDA_SUCCESS) << name;
    ASSERT_NE(got, nullptr) << name;
    EXPECT_STREQ(got, name);
  }
}

// cuGetErrorString: "a NULL-terminated string description of the error code": a
// description, not the enum name again.
TEST(ErrorText, EveryResultHasADescription) {
  for (const auto& [code, name] : kAllResults) {
    const char* got = nullptr;
    ASSERT_EQ(cuGetErrorString(code, &got), CUDA_SUCCESS) << name;
    ASSERT_NE(got, nullptr) << name;
    EXPECT_GT(std::strlen(got), 0u) << name;
    EXPECT_STRNE(got, name);
  }
}

// "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE will be returned and
// *pStr will be set to the NULL address." The codes are gaps in the enum, inside its value
// range (0..1023): a C++ caller cannot form values outside it without undefined behaviour.
TEST(ErrorText, UnknownCodesAreInvalidValueAndNull) {
  for (int code : {9, 35, 37, 47, 99, 227, 305, 403, 501, 601, 722, 813, 917, 998, 1000, 1023}) {
    const char* name = "sentinel";
    const char* text = "sentinel";
    EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(code), &name), CUDA_ERROR_INVALID_VALUE) << code;
    EXPECT_EQ(name, nullptr) << code;
    EXPECT_EQ(cuGetErrorString(static_cast<CUresult>(code), &text), CUDA_ERROR_INVALID_VALUE)
        << code;
    EXPECT_EQ(text, nullptr) << code;
  }
}

TEST(ErrorText, NullOutputIsInvalidValue) {
  EXPECT_EQ(cuGetErrorName(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGetErrorString(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
}

// ---------------------------------------------------------------------------------------
// cuGetExportTable
// ---------------------------------------------------------------------------------------

// The CUDA runtime asks for private tables no emulator can provide. The answer must be an
// error the caller can see, and no table pointer it could call through.
TEST(ExportTable, AnyTableIdIsAnErrorAndYieldsNoTable) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  const void* sentinel = reinterpret_cast<const void*>(0x1);
  CUuuid ids[3] = {};
  for (int i = 0; i < 16; ++i) {
    ids[1].bytes[i] = static_cast<char>(i * 17 + 3);
    ids[2].bytes[i] = static_cast<char>(0xff);
  }
  for (const CUuuid& id : ids) {
    const void* table = sentinel;
    EXPECT_NE(cuGetExportTable(&table, &id), CUDA_SUCCESS);
    EXPECT_TRUE(table == nullptr || table == sentinel) << "a table pointer was handed out";
  }
  const void* table = sentinel;
  EXPECT_NE(cuGetExportTable(&table, nullptr), CUDA_SUCCESS);
  EXPECT_NE(cuGetExportTable(nullptr, &ids[1]), CUDA_SUCCESS);
}

}  // namespace
