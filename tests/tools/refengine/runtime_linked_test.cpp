// The reference engine's runtime built with REFENGINE_LINK_DRIVER (refengine_runtime_linked):
// the cu* functions are linked against the toolkit's libcuda stub, so at run time the dynamic
// loader binds libcuda.so.1 from LD_LIBRARY_PATH, set by the suite's ENV to the emulator.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "allocator.hpp"
#include "driver.hpp"

namespace {

using refengine::Driver;

TEST(RefengineLinkedDriver, BindsLibcudaFromLdLibraryPath) {
  Driver d;
  EXPECT_EQ(d.source(), "linked");
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(d.mem_alloc), &info), 0);
  std::string file = info.dli_fname;
  // The emulator, not the toolkit's stub (whose functions only return CUDA_ERROR_STUB_LIBRARY).
  EXPECT_EQ(file.find("stubs"), std::string::npos) << file;
  EXPECT_NE(dlsym(RTLD_DEFAULT, "thawEmuGetDeviceStats"), nullptr)
      << "libcuda.so.1 at " << file << " is not the emulator";
}

TEST(RefengineLinkedDriver, LinksThePerThreadVariants) {
  Driver d;
  EXPECT_EQ(reinterpret_cast<void*>(d.memcpy_htod_async),
            dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2_ptsz"));
  EXPECT_EQ(reinterpret_cast<void*>(d.stream_synchronize),
            dlsym(RTLD_DEFAULT, "cuStreamSynchronize_ptsz"));
  EXPECT_EQ(reinterpret_cast<void*>(d.mem_alloc), dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
}

TEST(RefengineLinkedDriver, InitAndMemAllocWork) {
  Driver d;
  d.check(d.init(0), "cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  d.check(d.device_get(&dev, 0), "cuDeviceGet");
  d.check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  d.check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
  CUdeviceptr p = 0;
  d.check(d.mem_alloc(&p, 1 << 20), "cuMemAlloc");
  EXPECT_NE(p, 0u);
  unsigned in = 0xfeedbeef, out = 0;
  d.check(d.memcpy_htod(p, &in, sizeof in), "cuMemcpyHtoD");
  d.check(d.memcpy_dtoh(&out, p, sizeof out), "cuMemcpyDtoH");
  EXPECT_EQ(out, in);
  d.check(d.mem_free(p), "cuMemFree");
  {
    refengine::CachingAllocator a(d, dev, refengine::CachingAllocator::Mode::kExpandableSegments);
    EXPECT_NE(a.allocate(4096), 0u);
    EXPECT_EQ(a.stats().mapped_pages, 1u);
  }
  d.check(d.primary_ctx_release(dev), "cuDevicePrimaryCtxRelease");
}

}  // namespace
