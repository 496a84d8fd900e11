// The driver entry points PyTorch requires, looked up the way PyTorch looks them up, and the
// behaviour of the ones the emulator added for it (cuStreamWriteValue32/64, multicast, log
// callbacks).
//
// c10/cuda/driver_api.h lists them with the CUDA version each is pinned to; PyTorch resolves
// them at start-up through cudaGetDriverEntryPointByVersion(name, &fn, version,
// cudaEnableDefault, &status), which the runtime answers with the driver's
// cuGetProcAddress(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status). A REQUIRED one
// that does not resolve stops PyTorch ("Can't find <name>"); OPTIONAL ones may come back NULL.
// Rules are quoted from CUDA 13's cuda.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "emu_test_support.hpp"

namespace {

void* Exported(const char* name) {
  return dlsym(RTLD_DEFAULT, name);
}

struct Entry {
  const char* name;
  int version;           // as PyTorch pins it
  const char* exported;  // the ABI variant that version selects (cudaTypedefs.h)
};

// C10_LIBCUDA_DRIVER_API_REQUIRED.
constexpr Entry kRequired[] = {
    {"cuDeviceGet", 12000, "cuDeviceGet"},
    {"cuDeviceGetAttribute", 12000, "cuDeviceGetAttribute"},
    {"cuMemGetAddressRange", 12000, "cuMemGetAddressRange_v2"},
    {"cuMemAddressReserve", 12000, "cuMemAddressReserve"},
    {"cuMemRelease", 12000, "cuMemRelease"},
    {"cuMemMap", 12000, "cuMemMap"},
    {"cuMemAddressFree", 12000, "cuMemAddressFree"},
    {"cuMemSetAccess", 12000, "cuMemSetAccess"},
    {"cuMemUnmap", 12000, "cuMemUnmap"},
    {"cuMemCreate", 12000, "cuMemCreate"},
    {"cuMemGetAllocationGranularity", 12000, "cuMemGetAllocationGranularity"},
    {"cuMemExportToShareableHandle", 12000, "cuMemExportToShareableHandle"},
    {"cuMemImportFromShareableHandle", 12000, "cuMemImportFromShareableHandle"},
    {"cuMemRetainAllocationHandle", 12000, "cuMemRetainAllocationHandle"},
    {"cuMemGetAllocationPropertiesFromHandle", 12000, "cuMemGetAllocationPropertiesFromHandle"},
    {"cuMemsetD32Async", 12000, "cuMemsetD32Async"},
    {"cuStreamWriteValue32", 12000, "cuStreamWriteValue32_v2"},
    {"cuGetErrorString", 12000, "cuGetErrorString"},
};

// C10_LIBCUDA_DRIVER_API_OPTIONAL (12.3 multicast, 12.8 green contexts, 12.9 log callbacks).
constexpr Entry kOptional[] = {
    {"cuMulticastAddDevice", 12030, "cuMulticastAddDevice"},
    {"cuMulticastBindMem", 12030, "cuMulticastBindMem"},
    {"cuMulticastCreate", 12030, "cuMulticastCreate"},
    {"cuMulticastUnbind", 12030, "cuMulticastUnbind"},
    {"cuCtxFromGreenCtx", 12080, nullptr},
    {"cuCtxGetCurrent", 12080, "cuCtxGetCurrent"},
    {"cuCtxPopCurrent", 12080, "cuCtxPopCurrent_v2"},
    {"cuCtxPushCurrent", 12080, "cuCtxPushCurrent_v2"},
    {"cuCtxSetCurrent", 12080, "cuCtxSetCurrent"},
    {"cuGreenCtxCreate", 12080, nullptr},
    {"cuGreenCtxDestroy", 12080, nullptr},
    {"cuGreenCtxStreamCreate", 12080, nullptr},
    {"cuDevSmResourceSplitByCount", 12080, nullptr},
    {"cuDeviceGetDevResource", 12080, nullptr},
    {"cuDevResourceGenerateDesc", 12080, nullptr},
    {"cuLogsRegisterCallback", 12090, "cuLogsRegisterCallback"},
    {"cuLogsUnregisterCallback", 12090, "cuLogsUnregisterCallback"},
};

struct Lookup {
  CUresult result = CUDA_ERROR_UNKNOWN;
  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult status = static_cast<CUdriverProcAddressQueryResult>(3);
};

Lookup AsPyTorchDoes(const Entry& e) {
  Lookup l;
  l.result = cuGetProcAddress(e.name, &l.fn, e.version, CU_GET_PROC_ADDRESS_DEFAULT, &l.status);
  return l;
}

// Every REQUIRED entry point resolves, at its pinned version, to the ABI that version names.
// (Before this suite the emulator lacked cuStreamWriteValue32, and PyTorch could not start.)
TEST(PyTorchDriverApi, EveryRequiredEntryPointResolvesAtItsPinnedVersion) {
  for (const Entry& e : kRequired) {
    SCOPED_TRACE(std::string(e.name) + " at " + std::to_string(e.version));
    const Lookup l = AsPyTorchDoes(e);
    EXPECT_EQ(l.result, CUDA_SUCCESS);
    EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SUCCESS);
    ASSERT_NE(Exported(e.exported), nullptr) << e.exported << " is not exported";
    EXPECT_EQ(l.fn, Exported(e.exported));
  }
}

// The OPTIONAL ones resolve too, except the green-context family, which the emulator does not
// provide (emu/README.md): there the lookup says SYMBOL_NOT_FOUND with a NULL pointer, which
// PyTorch checks before use.
TEST(PyTorchDriverApi, OptionalEntryPointsResolveOrAreReportedMissing) {
  for (const Entry& e : kOptional) {
    SCOPED_TRACE(std::string(e.name) + " at " + std::to_string(e.version));
    const Lookup l = AsPyTorchDoes(e);
    EXPECT_EQ(l.result, CUDA_SUCCESS);
    if (e.exported != nullptr) {
      EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SUCCESS);
      EXPECT_EQ(l.fn, Exported(e.exported));
      EXPECT_NE(l.fn, nullptr);
    } else if (thaw::test::on_emulator()) {
      EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
      EXPECT_EQ(l.fn, nullptr);
    } else {
      EXPECT_EQ(l.status, CU_GET_PROC_ADDRESS_SUCCESS);
      EXPECT_NE(l.fn, nullptr);
    }
  }
}

// The memory operations appeared in CUDA 11.7 in the ABI PyTorch gets (_v2); an older version
// must not be handed it. The CUDA 8.0 ABI of the same name needs
// CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1; without it the lookup finds nothing usable.
TEST(PyTorchDriverApi, WriteValueLookupsFollowTheVersion) {
  for (const char* name : {"cuStreamWriteValue32", "cuStreamWriteValue64"}) {
    SCOPED_TRACE(name);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    ASSERT_EQ(cuGetProcAddress(name, &fn, 11070, CU_GET_PROC_ADDRESS_DEFAULT, &status),
              CUDA_SUCCESS);
    EXPECT_EQ(fn, Exported((std::string(name) + "_v2").c_str()));
    ASSERT_EQ(
        cuGetProcAddress(name, &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
        CUDA_SUCCESS);
    EXPECT_EQ(fn, Exported((std::string(name) + "_v2_ptsz").c_str()));
    ASSERT_EQ(cuGetProcAddress(name, &fn, 11060, CU_GET_PROC_ADDRESS_DEFAULT, &status),
              CUDA_SUCCESS);
    EXPECT_NE(fn, Exported((std::string(name) + "_v2").c_str())) << "a newer ABI was returned";
  }
}

// ---------------------------------------------------------------------------------------
// cuStreamWriteValue32 / cuStreamWriteValue64
// ---------------------------------------------------------------------------------------

class WriteValue : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuMemAlloc(&words_, kWords * sizeof(std::uint32_t)));
  }
  void TearDown() override {
    if (words_ != 0) EXPECT_CU(cuMemFree(words_));
    if (stream_ != nullptr) EXPECT_CU(cuStreamDestroy(stream_));
    if (ctx_ != nullptr) {
      EXPECT_CU(cuCtxSetCurrent(nullptr));
      EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
    }
  }

  std::vector<std::uint32_t> Words() {
    std::vector<std::uint32_t> out(kWords);
    EXPECT_CU(cuMemcpyDtoH(out.data(), words_, out.size() * sizeof out[0]));
    return out;
  }

  static constexpr std::size_t kWords = 64;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  CUdeviceptr words_ = 0;
};

// "Write a value to memory", in stream order: after the memset before it, and touching nothing
// else.
TEST_F(WriteValue, Write32StoresOneWordInStreamOrder) {
  ASSERT_CU(cuMemsetD32Async(words_, 7, kWords, stream_));
  ASSERT_CU(cuStreamWriteValue32(stream_, words_ + 8, 0xC0FFEEu, CU_STREAM_WRITE_VALUE_DEFAULT));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<std::uint32_t> want(kWords, 7);
  want[2] = 0xC0FFEEu;
  EXPECT_EQ(Words(), want);
}

// CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS says whether the 64-bit form is supported.
TEST_F(WriteValue, Write64StoresTwoWordsWhereTheDeviceSupportsIt) {
  int supported = 0;
  ASSERT_CU(
      cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev_));
  if (!supported) GTEST_SKIP() << "no 64-bit stream memory operations on this device";
  ASSERT_CU(cuMemsetD32Async(words_, 0, kWords, stream_));
  const std::uint64_t value = 0x0123456789abcdefull;
  ASSERT_CU(cuStreamWriteValue64(stream_, words_ + 16, value, CU_STREAM_WRITE_VALUE_DEFAULT));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<std::uint32_t> got = Words();
  std::uint64_t stored = 0;
  std::memcpy(&stored, &got[4], sizeof stored);
  EXPECT_EQ(stored, value);
  EXPECT_EQ(got[3], 0u);
  EXPECT_EQ(got[6], 0u);
}

// The pointer PyTorch gets is the function: it works through the lookup, on the legacy stream
// too, with or without the memory barrier.
TEST_F(WriteValue, ThePointerPyTorchLooksUpWorks) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(
      cuGetProcAddress("cuStreamWriteValue32", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  ASSERT_NE(fn, nullptr);
  auto write = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(fn);
  ASSERT_CU(cuMemsetD32(words_, 0, kWords));
  ASSERT_CU(cuCtxSynchronize());  // stream_ does not wait for the legacy stream
  ASSERT_CU(write(nullptr, words_, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  ASSERT_CU(write(stream_, words_ + 4, 2, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
  ASSERT_CU(cuCtxSynchronize());
  std::vector<std::uint32_t> got = Words();
  EXPECT_EQ(got[0], 1u);
  EXPECT_EQ(got[1], 2u);
}

// "If the memory was registered via cuMemHostRegister(), the device pointer should be obtained
// with cuMemHostGetDevicePointer()": pinned host memory through its device pointer.
TEST_F(WriteValue, WritesPinnedHostMemoryThroughItsDevicePointer) {
  void* host = nullptr;
  ASSERT_CU(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  std::memset(host, 0, 4096);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemHostGetDevicePointer(&d, host, 0));
  ASSERT_CU(cuStreamWriteValue32(stream_, d + 12, 99, CU_STREAM_WRITE_VALUE_DEFAULT));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(static_cast<volatile std::uint32_t*>(host)[3], 99u);
  EXPECT_CU(cuMemFreeHost(host));
}

// The flags are CUstreamWriteValue_flags; a write needs an address aligned to its size.
TEST_F(WriteValue, UnknownFlagsAndMisalignedAddressesAreInvalidValue) {
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue32(stream_, words_, 1, 0x2));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue32(stream_, words_, 1, 0x80000000u));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamWriteValue32(stream_, words_ + 2, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamWriteValue64(stream_, words_ + 4, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  // Pageable host memory is no device memory (a real GPU with HMM may reach it, so this is the
  // emulator's rule alone).
  std::uint32_t local = 0;
  THAW_EMU_CHECK(EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                               cuStreamWriteValue32(stream_, reinterpret_cast<CUdeviceptr>(&local),
                                                    1, CU_STREAM_WRITE_VALUE_DEFAULT)));
  ASSERT_CU(cuStreamSynchronize(stream_));
}

// Stream memory operations are captured like any other work: the write becomes a batch
// memory-op node of the graph and happens when the graph is launched, not before.
TEST_F(WriteValue, CapturedWriteBecomesABatchMemOpNodeAndRunsAtLaunch) {
  ASSERT_CU(cuMemsetD32(words_, 0, kWords));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamWriteValue32(stream_, words_ + 4, 5, CU_STREAM_WRITE_VALUE_DEFAULT));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(stream_, &graph));
  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &count));
  ASSERT_EQ(count, 1u);
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphGetNodes(graph, &node, &count));
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(node, &type));
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
  EXPECT_EQ(Words()[1], 0u) << "a captured write does not run";
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(Words()[1], 5u);
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
}

// A write into mapped memory the device may not access is a device fault, sticky for the
// context, as any other device write is. In a fresh process: the context stays broken.
TEST(WriteValueFault, WriteWithoutAccessIsAStickyIllegalAddress) {
  thaw::test::run_in_fresh_process({}, [] {
    CUcontext ctx = nullptr;  // not released: a broken context cannot be
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t size = 0;
    ASSERT_CU(cuMemGetAllocationGranularity(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h = 0;
    ASSERT_CU(cuMemCreate(&h, size, &prop, 0));
    CUdeviceptr va = 0;
    ASSERT_CU(cuMemAddressReserve(&va, size, 0, 0, 0));
    ASSERT_CU(cuMemMap(va, size, 0, h, 0));
    const CUresult write = cuStreamWriteValue32(nullptr, va, 1, CU_STREAM_WRITE_VALUE_DEFAULT);
    EXPECT_TRUE(write == CUDA_SUCCESS || write == CUDA_ERROR_ILLEGAL_ADDRESS)
        << thaw::test::cu_error_name(write);
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  });
}

TEST(WriteValueBeforeInit, IsNotInitialized) {
  thaw::test::run_in_fresh_process({}, [] {
    EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED,
                  cuStreamWriteValue32(nullptr, 0x1000, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED,
                  cuStreamWriteValue64(nullptr, 0x1000, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  });
}

// ---------------------------------------------------------------------------------------
// Multicast objects
// ---------------------------------------------------------------------------------------

// Multicast needs NVLink SHARP; on a device whose CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0
// (every emulated one) the calls are CUDA_ERROR_NOT_SUPPORTED, after their argument checks.
TEST(Multicast, UnsupportedDeviceAnswersNotSupported) {
  thaw::test::PrimaryContext primary;
  int supported = -1;
  ASSERT_CU(
      cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, primary.dev()));
  if (supported != 0) GTEST_SKIP() << "this device supports multicast";
  CUmulticastObjectProp prop{};
  prop.numDevices = 1;
  prop.size = 2 << 20;
  prop.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED,
                cuMulticastGetGranularity(&granularity, &prop, CU_MULTICAST_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle mc = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuMulticastCreate(&mc, &prop));
  EXPECT_EQ(mc, 0u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMulticastCreate(nullptr, &prop));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMulticastCreate(&mc, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMulticastGetGranularity(nullptr, &prop, CU_MULTICAST_GRANULARITY_MINIMUM));
}

// ---------------------------------------------------------------------------------------
// Log callbacks
// ---------------------------------------------------------------------------------------

void CUDA_CB IgnoreLog(void*, CUlogLevel, char*, size_t) {}

// cuLogsRegisterCallback: callback_out is "Optional"; the callback itself is not.
TEST(LogCallbacks, RegisterAndUnregister) {
  ASSERT_CU(cuInit(0));
  CUlogsCallbackHandle handle = nullptr;
  int user = 0;
  ASSERT_CU(cuLogsRegisterCallback(IgnoreLog, &user, &handle));
  ASSERT_NE(handle, nullptr);
  EXPECT_CU(cuLogsUnregisterCallback(handle));
  // A stale handle is the emulator's to reject; on a real driver it is undefined.
  THAW_EMU_CHECK(EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLogsUnregisterCallback(handle)));
  EXPECT_CU(cuLogsRegisterCallback(IgnoreLog, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLogsRegisterCallback(nullptr, &user, &handle));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLogsUnregisterCallback(nullptr));
}

}  // namespace
