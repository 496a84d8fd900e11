// The module image parsers (emu/src/cubin.cpp, emu/src/fatbin.cpp) on real images: nvcc 13
// builds cubins, fatbins and PTX from tests/emu/testdata/*.cu at build time, and these tests
// assert what the emulator's cuModuleLoad*, cuModuleGetGlobal and cuFuncGetParamInfo will
// report from them. The format notes are in emu/src/cubin.hpp and emu/src/fatbin.hpp.
//
// Bad input must give the documented codes and never crash: cuda.h lists
// CUDA_ERROR_INVALID_IMAGE ("the kernel image is invalid") and CUDA_ERROR_NO_BINARY_FOR_GPU
// ("no kernel image is available for execution on the device") for cuModuleLoadData.
// Truncations are parsed from buffers of exactly the truncated size, so that ASan reports
// any read past the end.
#include <fatbinary_section.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cubin.hpp"
#include "fatbin.hpp"

namespace {

using Bytes = std::vector<std::uint8_t>;
using emu::CubinInfo;
using emu::FatbinEntry;
using emu::KernelInfo;
using emu::KernelParam;

constexpr int kSm90 = 90;

#ifdef THAW_MODULE_TESTDATA
constexpr const char* kTestdata = THAW_MODULE_TESTDATA;
#else
constexpr const char* kTestdata = nullptr;
#endif

// The images nvcc built from testdata/*.cu (see testdata/CMakeLists.txt).
Bytes Image(const std::string& name) {
  std::ifstream f(std::string(kTestdata) + "/" + name, std::ios::binary);
  Bytes b((std::istreambuf_iterator<char>(f)), {});
  if (b.empty()) ADD_FAILURE() << "missing test image " << name << " in " << kTestdata;
  return b;
}

class ModuleImage : public testing::Test {
 protected:
  void SetUp() override {
    if (kTestdata == nullptr) GTEST_SKIP() << "built without nvcc: no test images";
  }
};

const KernelInfo* Kernel(const CubinInfo& info, const std::string& name) {
  for (const KernelInfo& k : info.kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

const emu::GlobalInfo* Global(const CubinInfo& info, const std::string& name) {
  for (const auto& g : info.globals) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

std::set<std::string> KernelNames(const CubinInfo& info) {
  std::set<std::string> names;
  for (const KernelInfo& k : info.kernels) names.insert(k.name);
  return names;
}

// {offset, size} per ordinal.
using Layout = std::vector<std::pair<unsigned, unsigned>>;
Layout LayoutOf(const KernelInfo& k) {
  Layout l;
  for (std::size_t i = 0; i < k.params.size(); ++i) {
    EXPECT_EQ(k.params[i].ordinal, i) << k.name;
    l.emplace_back(k.params[i].offset, k.params[i].size);
  }
  return l;
}

CubinInfo Parsed(const Bytes& b, int device_sm = kSm90) {
  std::string why;
  auto r = emu::parse_module_image(b.data(), b.size(), device_sm, {.diagnostic = &why});
  EXPECT_TRUE(r.has_value()) << "error " << (r ? 0 : r.error()) << ": " << why;
  return r ? *r : CubinInfo{};
}

CUresult ErrorOf(const Bytes& b, int device_sm = kSm90, std::string* why = nullptr) {
  auto r = emu::parse_module_image(b.data(), b.size(), device_sm, {.diagnostic = why});
  return r ? CUDA_SUCCESS : r.error();
}

// ---- Minimal ELF editing, to corrupt one field of a real image. ----
template <class T>
T Get(const Bytes& b, std::size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
template <class T>
void Put(Bytes& b, std::size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

struct Section {
  std::size_t header;  // offset of its section header
  std::uint32_t type;
  std::uint64_t offset, size;
  std::uint32_t link, info;
};

std::map<std::string, Section> Sections(const Bytes& b) {
  std::map<std::string, Section> out;
  const auto shoff = Get<std::uint64_t>(b, 40);
  const auto shnum = Get<std::uint16_t>(b, 60);
  const auto shstrndx = Get<std::uint16_t>(b, 62);
  const auto strtab = Get<std::uint64_t>(b, shoff + shstrndx * 64 + 24);
  for (unsigned i = 0; i < shnum; ++i) {
    const std::size_t h = shoff + i * 64;
    Section s{h,
              Get<std::uint32_t>(b, h + 4),
              Get<std::uint64_t>(b, h + 24),
              Get<std::uint64_t>(b, h + 32),
              Get<std::uint32_t>(b, h + 40),
              Get<std::uint32_t>(b, h + 44)};
    const char* name = reinterpret_cast<const char*>(b.data() + strtab + Get<std::uint32_t>(b, h));
    out.emplace(name, s);
  }
  return out;
}

// Offsets of the .nv.info records of `attr` in the named section.
std::vector<std::size_t> Records(const Bytes& b, const std::string& section, std::uint8_t attr) {
  const Section s = Sections(b).at(section);
  std::vector<std::size_t> found;
  for (std::size_t p = s.offset; p < s.offset + s.size;) {
    if (b[p + 1] == attr) found.push_back(p);
    p += 4 + (b[p] == 0x04 ? Get<std::uint16_t>(b, p + 2) : 0);
  }
  return found;
}

// Index and offset of the symbol named `name`.
std::size_t SymbolEntry(const Bytes& b, const std::string& name) {
  const auto secs = Sections(b);
  const Section sym = secs.at(".symtab"), str = secs.at(".strtab");
  for (std::size_t p = sym.offset; p < sym.offset + sym.size; p += 24) {
    const char* n = reinterpret_cast<const char*>(b.data() + str.offset + Get<std::uint32_t>(b, p));
    if (name == n) return p;
  }
  ADD_FAILURE() << "no symbol " << name;
  return 0;
}

// ---- What a real sm_90 cubin holds. ----

TEST_F(ModuleImage, Sm90CubinListsExactlyTheKernelsByMangledName) {
  const CubinInfo info = Parsed(Image("kernels.sm_90.cubin"));
  EXPECT_EQ(info.sm, 90);
  EXPECT_FALSE(info.arch_specific);
  // The out-of-line __device__ helper is a STT_FUNC symbol without STO_CUDA_ENTRY: not listed.
  EXPECT_EQ(KernelNames(info),
            (std::set<std::string>{"vec_add", "_Z5scaleIfEvPT_S0_l", "_Z5scaleIdEvPT_S0_l",
                                   "with_pair", "tile_sum", "no_params"}));
}

TEST_F(ModuleImage, ParameterOffsetsAndSizesFollowTheCAbi) {
  const CubinInfo info = Parsed(Image("kernels.sm_90.cubin"));
  const KernelInfo* k = Kernel(info, "vec_add");  // (const float*, const float*, float*, int)
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(LayoutOf(*k), (Layout{{0, 8}, {8, 8}, {16, 8}, {24, 4}}));
  EXPECT_EQ(k->param_bytes, 28u);

  k = Kernel(info, "_Z5scaleIfEvPT_S0_l");  // scale<float>(float*, float, long)
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(LayoutOf(*k), (Layout{{0, 8}, {8, 4}, {16, 8}}));
  EXPECT_EQ(k->param_bytes, 24u);

  k = Kernel(info, "_Z5scaleIdEvPT_S0_l");  // scale<double>(double*, double, long)
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(LayoutOf(*k), (Layout{{0, 8}, {8, 8}, {16, 8}}));
  EXPECT_EQ(k->param_bytes, 24u);

  k = Kernel(info, "with_pair");  // (Pair {float; double; int} by value, char, double*)
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(LayoutOf(*k), (Layout{{0, 24}, {24, 1}, {32, 8}}));
  EXPECT_EQ(k->param_bytes, 40u);

  k = Kernel(info, "tile_sum");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(LayoutOf(*k), (Layout{{0, 8}, {8, 8}}));
  EXPECT_EQ(k->param_bytes, 16u);

  k = Kernel(info, "no_params");
  ASSERT_NE(k, nullptr);
  EXPECT_TRUE(k->params.empty());
  EXPECT_EQ(k->param_bytes, 0u);
}

TEST_F(ModuleImage, ParameterSpaceOf16KiBAndMoreIsReadFromKparamInfoV2) {
  // ptxas switches to EIATTR_KPARAM_INFO_V2 (0x45) records: check they are there, so the test
  // keeps testing that path.
  const Bytes b = Image("big_param.sm_90.cubin");
  EXPECT_EQ(Records(b, ".nv.info.big_param", 0x45).size(), 2u);
  EXPECT_TRUE(Records(b, ".nv.info.big_param", 0x17).empty());
  const CubinInfo info = Parsed(b);
  const KernelInfo* k = Kernel(info, "big_param");  // (Big {unsigned char[20000]}, int*)
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(LayoutOf(*k), (Layout{{0, 20000}, {20000, 8}}));
  EXPECT_EQ(k->param_bytes, 20008u);
}

TEST_F(ModuleImage, LaunchBoundsGiveMaxThreads) {
  const CubinInfo info = Parsed(Image("kernels.sm_90.cubin"));
  for (const KernelInfo& k : info.kernels) {
    EXPECT_EQ(k.max_threads, k.name == "with_pair" ? 256u : 0u)
        << k.name;  // __launch_bounds__(256)
  }
}

TEST_F(ModuleImage, ThreeDimensionalBoundsMultiply) {
  // testdata/bounds.ptx: .maxntid 32, 4, 2 and .reqntid 64, 2, 1.
  const CubinInfo info = Parsed(Image("bounds.sm_90.cubin"));
  ASSERT_NE(Kernel(info, "max_ntid"), nullptr);
  ASSERT_NE(Kernel(info, "req_ntid"), nullptr);
  EXPECT_EQ(Kernel(info, "max_ntid")->max_threads, 256u);
  EXPECT_EQ(Kernel(info, "req_ntid")->max_threads, 128u);
}

TEST_F(ModuleImage, StaticSharedMemoryIsTheSharedSectionSize) {
  // tile_sum has `__shared__ float tile[128]` (512 bytes). On sm_90 ptxas puts the 1 KiB of
  // system-reserved shared memory at the start of .nv.shared.tile_sum, on sm_80 it does not.
  const CubinInfo sm90 = Parsed(Image("kernels.sm_90.cubin"));
  const CubinInfo sm80 = Parsed(Image("kernels.sm_80.cubin"), 80);
  for (const KernelInfo& k : sm90.kernels) {
    EXPECT_EQ(k.shared_bytes, k.name == "tile_sum" ? 512u + 1024u : 0u) << k.name;
  }
  ASSERT_NE(Kernel(sm80, "tile_sum"), nullptr);
  EXPECT_EQ(Kernel(sm80, "tile_sum")->shared_bytes, 512u);
}

TEST_F(ModuleImage, RegisterCountsComeFromTheModuleInfo) {
  // The exact counts are ptxas's choice; every kernel has one (EIATTR_REGCOUNT), within the
  // architecture's 255.
  const CubinInfo info = Parsed(Image("kernels.sm_90.cubin"));
  for (const KernelInfo& k : info.kernels) {
    EXPECT_GT(k.num_regs, 0u) << k.name;
    EXPECT_LE(k.num_regs, 255u) << k.name;
  }
}

TEST_F(ModuleImage, GlobalsHaveTheirSizesAndInitialBytes) {
  const CubinInfo info = Parsed(Image("kernels.sm_90.cubin"));
  std::set<std::string> names;
  for (const auto& g : info.globals) names.insert(g.name);
  EXPECT_EQ(names, (std::set<std::string>{"dev_counter", "dev_zero", "const_coeffs",
                                          "managed_counter", "_ZN9thaw_test8ns_valueE"}));

  const auto* g = Global(info, "dev_counter");  // __device__ int = 42
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size, 4u);
  EXPECT_EQ(g->init, (Bytes{42, 0, 0, 0}));
  EXPECT_FALSE(g->constant);
  EXPECT_FALSE(g->managed);

  g = Global(info, "dev_zero");  // __device__ float[16], no initialiser: no bytes in the file
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size, 64u);
  EXPECT_TRUE(g->init.empty());

  g = Global(info, "const_coeffs");  // __constant__ float[4] = {1, 2, 3, 4}
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size, 16u);
  EXPECT_TRUE(g->constant);
  const float want[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  ASSERT_EQ(g->init.size(), sizeof want);
  EXPECT_EQ(std::memcmp(g->init.data(), want, sizeof want), 0);

  g = Global(info, "managed_counter");  // __managed__ int = 7
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->managed);
  EXPECT_EQ(g->init, (Bytes{7, 0, 0, 0}));

  g = Global(info, "_ZN9thaw_test8ns_valueE");  // thaw_test::ns_value = 0x0123456789abcdef
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size, 8u);
  EXPECT_EQ(g->init, (Bytes{0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01}));
}

TEST_F(ModuleImage, RelocatableCubinGivesTheSameKernelsAndGlobals) {
  // nvcc -rdc=true: ET_REL, and the CUDA sections get processor-specific sh_types.
  const CubinInfo exec = Parsed(Image("kernels.sm_90.cubin"));
  const CubinInfo rel = Parsed(Image("kernels.rdc.sm_90.cubin"));
  EXPECT_EQ(KernelNames(rel), KernelNames(exec));
  for (const KernelInfo& k : exec.kernels) {
    const KernelInfo* r = Kernel(rel, k.name);
    ASSERT_NE(r, nullptr) << k.name;
    EXPECT_EQ(LayoutOf(*r), LayoutOf(k)) << k.name;
    EXPECT_EQ(r->param_bytes, k.param_bytes) << k.name;
  }
  ASSERT_EQ(rel.globals.size(), exec.globals.size());
  for (const auto& g : exec.globals) {
    const auto* r = Global(rel, g.name);
    ASSERT_NE(r, nullptr) << g.name;
    EXPECT_EQ(r->size, g.size) << g.name;
    EXPECT_EQ(r->init, g.init) << g.name;
  }
}

TEST_F(ModuleImage, ImageSizeAndElfExtentAreTheFileSize) {
  for (const char* name :
       {"kernels.sm_90.cubin", "kernels.sm_80.cubin", "kernels.sm_100.cubin",
        "kernels.rdc.sm_90.cubin", "big_param.sm_90.cubin", "tiny.sm_90.cubin"}) {
    const Bytes b = Image(name);
    EXPECT_EQ(emu::elf_extent(b.data(), b.size()), b.size()) << name;
    Bytes padded = b;  // cuModuleLoadData passes no size: bytes after the image are not its
    padded.resize(b.size() + 4096, 0xcc);
    EXPECT_EQ(emu::elf_extent(padded.data(), padded.size()), b.size()) << name;
    auto info = emu::parse_cubin(padded.data(), padded.size());
    ASSERT_TRUE(info.has_value()) << name;
    EXPECT_EQ(info->image_size, b.size()) << name;
  }
}

TEST_F(ModuleImage, ElfExtentNeedsTheWholeImageWithinTheLimit) {
  const Bytes b = Image("tiny.sm_90.cubin");
  for (std::size_t limit = 0; limit < b.size(); ++limit) {
    ASSERT_FALSE(emu::elf_extent(b.data(), limit).has_value()) << limit;
  }
  EXPECT_FALSE(emu::elf_extent(nullptr, 1 << 20).has_value());
}

TEST_F(ModuleImage, ElfOfAnotherMachineIsNotACubin) {
  Bytes b = Image("tiny.sm_90.cubin");
  Put<std::uint16_t>(b, 18, 62);  // EM_X86_64
  EXPECT_FALSE(emu::elf_extent(b.data(), b.size()).has_value());
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);
  b = Image("tiny.sm_90.cubin");
  b[4] = 1;  // ELFCLASS32
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);
}

// ---- Architectures. ----

TEST_F(ModuleImage, CubinForAnotherGpuIsNoBinaryForGpu) {
  std::string why;
  EXPECT_EQ(ErrorOf(Image("kernels.sm_80.cubin"), kSm90, &why), CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_NE(why.find("sm_80"), std::string::npos) << why;
  EXPECT_EQ(ErrorOf(Image("kernels.sm_100.cubin")), CUDA_ERROR_NO_BINARY_FOR_GPU);
  // parse_cubin itself does not judge: it reports the SM.
  const Bytes b = Image("kernels.sm_100.cubin");
  auto info = emu::parse_cubin(b.data(), b.size());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->sm, 100);
}

TEST_F(ModuleImage, CubinRunsOnLaterMinorVersionsOfItsMajor) {
  // Binary compatibility: sm_80 SASS runs on sm_86, not on sm_90; sm_90a only on sm_90.
  EXPECT_EQ(Parsed(Image("kernels.sm_80.cubin"), 86).sm, 80);
  EXPECT_TRUE(emu::cubin_runs_on(90, true, 90));
  EXPECT_FALSE(emu::cubin_runs_on(86, false, 80));
  EXPECT_FALSE(emu::cubin_runs_on(90, true, 91));
  EXPECT_FALSE(emu::cubin_runs_on(0, false, 90));
}

TEST_F(ModuleImage, Sm90aCubinLoadsOnSm90AndSaysSo) {
  // nvcc 13 marks sm_90a in .nv.compat, not in e_flags.
  const CubinInfo info = Parsed(Image("kernels.sm_90a.cubin"));
  EXPECT_EQ(info.sm, 90);
  EXPECT_TRUE(info.arch_specific);
  EXPECT_EQ(KernelNames(info), KernelNames(Parsed(Image("kernels.sm_90.cubin"))));
}

TEST_F(ModuleImage, PreCuda13FlagsLayoutIsDecoded) {
  // EI_ABIVERSION 7: SM in the low byte, EF_CUDA_64BIT_ADDRESS 0x400, 'a' in bit 11, the
  // virtual SM in bits 16..23.
  Bytes b = Image("tiny.sm_90.cubin");
  b[8] = 7;
  Put<std::uint32_t>(b, 48, 0x005a0000u | 0x400u | 90u);
  EXPECT_EQ(emu::cubin_arch(b.data(), b.size())->sm, 90);
  EXPECT_FALSE(emu::cubin_arch(b.data(), b.size())->arch_specific);
  EXPECT_EQ(Parsed(b).sm, 90);
  Put<std::uint32_t>(b, 48, 0x005a0000u | 0x800u | 0x400u | 90u);
  EXPECT_TRUE(emu::cubin_arch(b.data(), b.size())->arch_specific);
  Put<std::uint32_t>(b, 48, 0x00500000u | 0x400u | 80u);
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_NO_BINARY_FOR_GPU);
  // And the CUDA 13 layout, as nvcc writes it for sm_90 (checked against the real image).
  const Bytes real = Image("tiny.sm_90.cubin");
  EXPECT_EQ(real[8], 8);
  EXPECT_EQ(Get<std::uint32_t>(real, 48), 0x06005a04u);
}

// ---- Fatbins. ----

TEST_F(ModuleImage, FatbinListsItsEntries) {
  const Bytes b = Image("kernels.sm_90_sm_80.fatbin");
  EXPECT_EQ(emu::fatbin_extent(b.data(), b.size()), b.size());
  auto entries = emu::parse_fatbin(b.data(), b.size());
  ASSERT_TRUE(entries.has_value());
  ASSERT_EQ(entries->size(), 2u);
  std::set<int> sms;
  for (const FatbinEntry& e : *entries) {
    EXPECT_EQ(e.kind, FatbinEntry::Kind::kElf);
    EXPECT_FALSE(e.compressed);
    EXPECT_GE(e.payload, b.data());
    EXPECT_LE(e.payload + e.payload_size, b.data() + b.size());
    EXPECT_EQ(emu::cubin_arch(e.payload, e.payload_size)->sm, e.sm);
    sms.insert(e.sm);
  }
  EXPECT_EQ(sms, (std::set<int>{80, 90}));
}

TEST_F(ModuleImage, FatbinGivesTheCubinForTheDevice) {
  const Bytes b = Image("kernels.sm_90_sm_80.fatbin");
  const CubinInfo sm90 = Parsed(b, 90);
  EXPECT_EQ(sm90.sm, 90);
  EXPECT_EQ(Kernel(sm90, "tile_sum")->shared_bytes, 1536u);  // the sm_90 image's
  EXPECT_EQ(Parsed(b, 80).sm, 80);
  EXPECT_EQ(Parsed(b, 86).sm, 80);
  // Parsed through the fatbin or from the bare cubin: the same module.
  const CubinInfo bare = Parsed(Image("kernels.sm_90.cubin"));
  EXPECT_EQ(KernelNames(sm90), KernelNames(bare));
  EXPECT_EQ(sm90.image_size, bare.image_size);
  EXPECT_EQ(ErrorOf(b, 100), CUDA_ERROR_NO_BINARY_FOR_GPU);
}

TEST_F(ModuleImage, FatbinWithPtxAndCubinLoadsTheCubin) {
  const Bytes b = Image("kernels.ptx_sm_90.fatbin");
  auto entries = emu::parse_fatbin(b.data(), b.size());
  ASSERT_TRUE(entries.has_value());
  std::set<FatbinEntry::Kind> kinds;
  for (const FatbinEntry& e : *entries) kinds.insert(e.kind);
  EXPECT_EQ(kinds, (std::set<FatbinEntry::Kind>{FatbinEntry::Kind::kPtx, FatbinEntry::Kind::kElf}));
  EXPECT_EQ(Parsed(b).sm, 90);
}

TEST_F(ModuleImage, FatbinWithoutACubinForTheDeviceIsNoBinaryForGpu) {
  EXPECT_EQ(ErrorOf(Image("kernels.sm_80.fatbin")), CUDA_ERROR_NO_BINARY_FOR_GPU);
  // PTX only (compressed, as nvcc 13 writes PTX by default): no JIT in the emulator.
  const Bytes ptx = Image("kernels.compute_90.fatbin");
  auto entries = emu::parse_fatbin(ptx.data(), ptx.size());
  ASSERT_TRUE(entries.has_value());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].kind, FatbinEntry::Kind::kPtx);
  EXPECT_EQ((*entries)[0].sm, 90);
  EXPECT_TRUE((*entries)[0].compressed);
  std::string why;
  EXPECT_EQ(ErrorOf(ptx, kSm90, &why), CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_NE(why.find("JIT"), std::string::npos) << why;
}

TEST_F(ModuleImage, CompressedCubinIsNoBinaryForGpu) {
  // -Xfatbin -compress-all: the sm_90 cubin is there but compressed; no decompressor.
  const Bytes b = Image("kernels.compressed.fatbin");
  auto entries = emu::parse_fatbin(b.data(), b.size());
  ASSERT_TRUE(entries.has_value());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].kind, FatbinEntry::Kind::kElf);
  EXPECT_TRUE((*entries)[0].compressed);
  std::string why;
  EXPECT_EQ(ErrorOf(b, kSm90, &why), CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_NE(why.find("compressed"), std::string::npos) << why;
}

TEST_F(ModuleImage, FatbinWrapperIsFollowedToItsContainer) {
  const Bytes b = Image("kernels.sm_90_sm_80.fatbin");
  __fatBinC_Wrapper_t w{FATBINC_MAGIC, FATBINC_VERSION,
                        reinterpret_cast<const unsigned long long*>(b.data()), nullptr};
  const auto* p = reinterpret_cast<const std::uint8_t*>(&w);
  auto info = emu::parse_module_image(p, sizeof w, kSm90);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->sm, 90);
  EXPECT_EQ(emu::module_image_extent(p, sizeof w), sizeof w);
  EXPECT_FALSE(emu::fatbin_extent(p, sizeof w).has_value());  // a wrapper is not a container

  auto no_follow = emu::parse_module_image(p, sizeof w, kSm90, {.follow_wrapper = false});
  ASSERT_FALSE(no_follow.has_value());
  EXPECT_EQ(no_follow.error(), CUDA_ERROR_INVALID_IMAGE);

  __fatBinC_Wrapper_t null_data{FATBINC_MAGIC, FATBINC_VERSION, nullptr, nullptr};
  auto r = emu::parse_module_image(reinterpret_cast<const std::uint8_t*>(&null_data),
                                   sizeof null_data, kSm90);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), CUDA_ERROR_INVALID_IMAGE);
}

TEST_F(ModuleImage, FatbinExtentIsTheContainerSize) {
  for (const char* name : {"kernels.sm_90_sm_80.fatbin", "kernels.compute_90.fatbin",
                           "kernels.compressed.fatbin", "tiny.sm_90.fatbin"}) {
    Bytes b = Image(name);
    const std::size_t size = b.size();
    EXPECT_EQ(emu::fatbin_extent(b.data(), size), size) << name;
    EXPECT_EQ(emu::module_image_extent(b.data(), size), size) << name;
    EXPECT_FALSE(emu::fatbin_extent(b.data(), size - 1).has_value()) << name;
    b.resize(size + 100, 0xcc);
    EXPECT_EQ(emu::fatbin_extent(b.data(), b.size()), size) << name;
  }
}

// ---- PTX and other things that are not cubins. ----

TEST_F(ModuleImage, PtxTextIsNoBinaryForGpu) {
  Bytes ptx = Image("kernels.ptx");
  EXPECT_EQ(ErrorOf(ptx), CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_FALSE(emu::module_image_extent(ptx.data(), ptx.size()).has_value());  // no NUL yet
  ptx.push_back(0);
  EXPECT_EQ(emu::module_image_extent(ptx.data(), ptx.size() + 0), ptx.size());
  const std::string text = "  /* generated */\n// comment\n.version 9.0\n.target sm_90\n";
  EXPECT_EQ(ErrorOf(Bytes(text.begin(), text.end())), CUDA_ERROR_NO_BINARY_FOR_GPU);
}

TEST_F(ModuleImage, AnythingElseIsInvalidImage) {
  const std::string text = "hello, this is not a module";
  EXPECT_EQ(ErrorOf(Bytes(text.begin(), text.end())), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(ErrorOf(Bytes(4096, 0)), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(ErrorOf(Bytes{}), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(ErrorOf(Bytes{0x7f, 'E', 'L', 'F'}), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(ErrorOf(Bytes{0x50, 0xed, 0x55, 0xba}), CUDA_ERROR_INVALID_IMAGE);
  auto r = emu::parse_module_image(nullptr, 100, kSm90);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), CUDA_ERROR_INVALID_VALUE);
  EXPECT_FALSE(emu::module_image_extent(Bytes(64, 0x01).data(), 64).has_value());
}

// ---- Truncation and corruption. ----

void ExpectEveryPrefixInvalid(const Bytes& full) {
  for (std::size_t n = 0; n < full.size(); ++n) {
    Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = emu::parse_module_image(prefix.data(), prefix.size(), kSm90);
    ASSERT_FALSE(r.has_value()) << "prefix of " << n << " bytes parsed";
    ASSERT_EQ(r.error(), CUDA_ERROR_INVALID_IMAGE) << "prefix of " << n << " bytes";
    if (prefix.size() >= 64 && prefix[0] == 0x7f) {
      ASSERT_FALSE(emu::parse_cubin(prefix.data(), prefix.size()).has_value()) << n;
    }
  }
}

TEST_F(ModuleImage, EveryTruncationOfACubinIsInvalidImage) {
  ExpectEveryPrefixInvalid(Image("tiny.sm_90.cubin"));
  ExpectEveryPrefixInvalid(Image("kernels.sm_90.cubin"));
}

TEST_F(ModuleImage, EveryTruncationOfAFatbinIsInvalidImage) {
  ExpectEveryPrefixInvalid(Image("tiny.sm_90.fatbin"));
}

TEST_F(ModuleImage, SectionOutsideTheFileIsInvalidImage) {
  Bytes b = Image("tiny.sm_90.cubin");
  const Section text = Sections(b).at(".text.tiny");
  Put<std::uint64_t>(b, text.header + 32, b.size());  // sh_size past the end
  EXPECT_FALSE(emu::elf_extent(b.data(), b.size()).has_value());
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = Image("tiny.sm_90.cubin");
  Put<std::uint64_t>(b, text.header + 24, ~std::uint64_t{0} - 8);  // offset + size overflows
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = Image("tiny.sm_90.cubin");
  Put<std::uint16_t>(b, 62, 999);  // e_shstrndx past the section table
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = Image("tiny.sm_90.cubin");
  Put<std::uint16_t>(b, 58, 40);  // e_shentsize
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);
}

TEST_F(ModuleImage, CorruptSymbolTableIsInvalidImage) {
  Bytes b = Image("kernels.sm_90.cubin");
  const Section sym = Sections(b).at(".symtab");
  Put<std::uint64_t>(b, sym.header + 56, 16);  // sh_entsize
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = Image("kernels.sm_90.cubin");
  Put<std::uint32_t>(b, SymbolEntry(b, "vec_add"), 0x7fffffff);  // st_name past .strtab
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = Image("kernels.sm_90.cubin");
  Put<std::uint64_t>(b, SymbolEntry(b, "dev_counter") + 8, 4096);  // st_value past its section
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);
}

TEST_F(ModuleImage, CorruptKernelInfoIsInvalidImage) {
  const Bytes good = Image("kernels.sm_90.cubin");
  const auto kparams = Records(good, ".nv.info.vec_add", 0x17);
  ASSERT_EQ(kparams.size(), 4u);

  Bytes b = good;
  b[kparams[0]] = 0x07;  // an unknown record format
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;
  Put<std::uint16_t>(b, kparams[0] + 2, 0x4000);  // SVAL payload past the section
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;
  Put<std::uint16_t>(b, kparams[0] + 2, 8);  // KPARAM_INFO payload is 12 bytes
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;  // two parameters with ordinal 2, none with 3
  Put<std::uint16_t>(b, kparams[0] + 8, Get<std::uint16_t>(good, kparams[1] + 8));
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;  // a parameter past EIATTR_CBANK_PARAM_SIZE
  Put<std::uint16_t>(b, kparams[0] + 10, 0x100);
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;  // a section that ends inside a record header
  const Section s = Sections(good).at(".nv.info.vec_add");
  Put<std::uint64_t>(b, s.header + 32, s.size - 2);
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  // Control: the unmodified image parses.
  EXPECT_EQ(ErrorOf(good), CUDA_SUCCESS);
}

TEST_F(ModuleImage, CorruptFatbinIsInvalidImage) {
  const Bytes good = Image("tiny.sm_90.fatbin");
  Bytes b = good;
  Put<std::uint16_t>(b, 4, 2);  // container version
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;
  Put<std::uint32_t>(b, 16 + 4, 0x20);  // entry header smaller than its fixed fields
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;
  Put<std::uint64_t>(b, 16 + 8, Get<std::uint64_t>(good, 16 + 8) + 8);  // payload past the end
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  b = good;  // the entry's payload is not an ELF image
  b[16 + Get<std::uint32_t>(good, 16 + 4)] = 0;
  EXPECT_EQ(ErrorOf(b), CUDA_ERROR_INVALID_IMAGE);

  // A container without entries is well formed and has no binary for any GPU.
  Bytes empty(good.begin(), good.begin() + 16);
  Put<std::uint64_t>(empty, 8, 0);
  EXPECT_EQ(ErrorOf(empty), CUDA_ERROR_NO_BINARY_FOR_GPU);
}

// Random corruption: every outcome is a parsed module or one of the two image errors, and a
// parsed module is self-consistent. (The fuzz replay, tests/fuzz, does many more.)
TEST_F(ModuleImage, RandomByteFlipsNeverCrash) {
  std::mt19937_64 rng(20240613);
  const std::vector<Bytes> seeds = {Image("tiny.sm_90.cubin"), Image("kernels.sm_90.cubin"),
                                    Image("tiny.sm_90.fatbin"),
                                    Image("kernels.sm_90_sm_80.fatbin")};
  int parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = seeds[iter % seeds.size()];
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      // Half of the flips land in the first 1 KiB, where the headers and the tables of small
      // images are.
      const std::size_t span = (rng() & 1) != 0 ? std::min<std::size_t>(b.size(), 1024) : b.size();
      b[rng() % span] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    }
    auto r = emu::parse_module_image(b.data(), b.size(), kSm90);
    if (!r) {
      ASSERT_TRUE(r.error() == CUDA_ERROR_INVALID_IMAGE ||
                  r.error() == CUDA_ERROR_NO_BINARY_FOR_GPU)
          << r.error();
      continue;
    }
    ++parsed;
    ASSERT_LE(r->image_size, b.size());
    for (const KernelInfo& k : r->kernels) {
      for (std::size_t i = 0; i < k.params.size(); ++i) {
        ASSERT_EQ(k.params[i].ordinal, i);
        ASSERT_LE(std::uint64_t{k.params[i].offset} + k.params[i].size, k.param_bytes);
      }
    }
    for (const auto& g : r->globals) ASSERT_LE(g.init.size(), g.size);
  }
  EXPECT_GT(parsed, 0);  // flips in code bytes leave a loadable image
}

}  // namespace
