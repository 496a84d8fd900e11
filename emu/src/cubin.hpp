// Parsers for CUDA module images: ELF cubins (this file) and fatbin containers (fatbin.hpp).
//
// Pure functions over a byte range: no driver state, no allocation of device memory, no
// exceptions. Every read is bounded by the size the caller passes; malformed or truncated
// input gives CUDA_ERROR_INVALID_IMAGE, never a crash (tests/emu/cubin_test.cpp and the
// fuzz target tests/fuzz/module_image_fuzz.cpp check that).
//
// The cubin format as nvcc 13.0 (ptxas V13.0.88) writes it, verified on images it produced
// (`nvcc -cubin -arch=sm_XX`, also -rdc=true):
//
// ELF header: ELFCLASS64, little endian, e_machine EM_CUDA (190), e_type ET_EXEC (ET_REL
//   with -rdc=true). e_ident[EI_OSABI] is 0x41 (older toolchains wrote 0x33); not checked.
//   e_flags has two layouts, told apart by e_ident[EI_ABIVERSION]:
//     ABI version >= 8 (CUDA 13): SM in bits 8..15 (sm_80 0x06005004, sm_90 0x06005a04,
//       sm_100 0x06006402, sm_120 0x06007802); EF_CUDA_ACCELERATORS (sm_XXa) is bit 3.
//     ABI version < 8 (CUDA 12 and older): SM in bits 0..7, EF_CUDA_ACCELERATORS_V1 is bit 11
//       (from LLVM's ELF.h; no older nvcc here to check it on).
//   nvcc 13.0 does NOT set the accelerator bit for sm_90a/sm_100a/sm_120a: e_flags of an
//   sm_90a cubin equal those of an sm_90 one. The 'a' marker it does write is record 0x09
//   (EIFMT_BVAL, value 1) of the `.nv.compat` section (sh_type 0x70000086), which is 0 for
//   sm_90/sm_100/sm_100f and 1 for sm_90a/sm_100a/sm_120a. Both are read.
//
// Sections used (all matched by name; sh_type differs between ET_EXEC and ET_REL images):
//   .text.<kernel>        code; sh_info = index of the kernel's symbol. (Older toolchains put the
//                         register count in sh_info bits 24..31, unverified; nvcc 13 leaves them
//                         0 and writes the count in .nv.info's EIATTR_REGCOUNT, which wins.)
//   .nv.info              sh_type 0x70000000, per-module attributes keyed by symbol index:
//                         EIATTR_REGCOUNT (0x2f) and EIATTR_FRAME_SIZE (0x11), both SVAL
//                         {u32 symbol index; u32 value}.
//   .nv.info.<kernel>     sh_type 0x70000000, sh_info = section index of .text.<kernel>; the
//                         kernel's attributes (records below).
//   .nv.shared.<kernel>   NOBITS (ET_REL: sh_type 0x7000000a); sh_size = static shared memory.
//                         On sm_90 ptxas places the 1 KiB system-reserved shared memory at the
//                         start of this section: a kernel with `__shared__ float t[128]` has a
//                         0x600-byte section on sm_90 and a 0x200-byte one on sm_80. A kernel
//                         without static __shared__ has no section. What the real driver reports
//                         as CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES for it was not checked on
//                         hardware.
//   .nv.global            NOBITS (ET_REL: 0x70000007): zero-initialised __device__ variables.
//   .nv.global.init       PROGBITS (ET_REL: 0x70000008): initialised __device__ variables.
//   .nv.constant<N>       __constant__ variables (bank 3 on sm_80/sm_90) with their bytes
//                         (zeros when not initialised). .nv.constant0.<kernel> is the kernel's
//                         parameter bank and .nv.constant4 holds driver-patched addresses; neither
//                         holds user variables.
//   .symtab / .strtab     kernels are STT_FUNC symbols with STO_CUDA_ENTRY (st_other & 0x10);
//                         non-inlined __device__ functions are STT_FUNC without it (e.g. the
//                         local `$kernel$_Z6helperf`, or global `_Z7helper2f` under -rdc).
//                         Variables are STT_OBJECT (ET_REL: also type 13) symbols defined in the
//                         sections above; st_value is the offset in the section. __managed__
//                         variables carry STO_CUDA_MANAGED (st_other & 0x04). In whole-program
//                         images the variable symbols are STB_LOCAL; their names are the C++ names
//                         (mangled when in a namespace: `_ZN2ns5nsvarE`).
//
// .nv.info records: {u8 format; u8 attribute; ...}; every record starts with 4 bytes:
//   EIFMT_NVAL 0x01: {fmt, attr, u16 0}                      (e.g. EIATTR_EXPLICIT_CLUSTER 0x3e)
//   EIFMT_BVAL 0x02: {fmt, attr, u8 value, u8 0}             (e.g. EIATTR_NUM_BARRIERS 0x4c)
//   EIFMT_HVAL 0x03: {fmt, attr, u16 value}                  (e.g. EIATTR_CBANK_PARAM_SIZE 0x19)
//   EIFMT_SVAL 0x04: {fmt, attr, u16 size, u8 payload[size]} (no padding after the payload)
// Kernel attributes read here:
//   EIATTR_KPARAM_INFO    0x17 SVAL 12 bytes {u32 index (0); u16 ordinal; u16 offset; u32 tail},
//                         parameter size = (tail >> 18) & 0x3fff (bits 12..15 of tail are 0xf in
//                         every image seen). Used for kernels with small parameter spaces.
//   EIATTR_KPARAM_INFO_V2 0x45 SVAL 12 bytes {u32 index; u16 ordinal; u16 offset; u32 size}:
//                         written instead of 0x17 for every parameter of kernels with large
//                         parameter spaces (seen for 16392 and 20008 bytes; CUDA 12.1+ allows
//                         32764; the exact threshold was not pinned down); the last word is the
//                         plain byte size (a 20000-byte struct: 0x00004e20).
//   EIATTR_CBANK_PARAM_SIZE 0x19 HVAL: bytes of the parameter buffer (absent without parameters).
//   EIATTR_PARAM_CBANK    0x0a SVAL {u32 symbol of .nv.constant0.<kernel>; u16 offset; u16 size}
//                         (offset 0x210 on sm_90, 0x160 on sm_80; size = CBANK_PARAM_SIZE).
//   EIATTR_MAX_THREADS    0x05 SVAL {u32 x, y, z} from __launch_bounds__ (.maxntid).
//   EIATTR_REQNTID        0x10 SVAL {u32 x, y, z} from .reqntid.
// Records appear in reverse parameter order; they are sorted by ordinal here.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if __has_include(<expected>)
#include <expected>
#endif

namespace emu {

#if defined(__cpp_lib_expected) && __cpp_lib_expected >= 202202L
template <class T>
using ImageResult = std::expected<T, CUresult>;
using ImageError = std::unexpected<CUresult>;
#else
// clang 14 with libstdc++ 12 (the libFuzzer build, tests/fuzz/run-libfuzzer.sh) has no
// std::expected; this is the subset of it that the parsers and their callers use. With
// g++ 12 in C++23 mode ImageResult<T> *is* std::expected<T, CUresult>.
struct ImageError {
  explicit ImageError(CUresult e) : err(e) {}
  CUresult error() const { return err; }
  CUresult err;
};
template <class T>
class ImageResult {
 public:
  ImageResult(T v) : ok_(true), value_(std::move(v)) {}   // NOLINT: implicit like std::expected
  ImageResult(ImageError e) : ok_(false), err_(e.err) {}  // NOLINT
  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  T& operator*() { return value_; }
  const T& operator*() const { return value_; }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }
  CUresult error() const { return err_; }

 private:
  bool ok_;
  T value_{};
  CUresult err_ = CUDA_SUCCESS;
};
#endif

struct KernelParam {
  unsigned ordinal = 0;
  unsigned offset = 0;  // in the parameter buffer
  unsigned size = 0;
};

struct KernelInfo {
  std::string name;                 // mangled, as in the symbol table ("_Z5scaleIfEvPT_S0_l")
  std::vector<KernelParam> params;  // ordinals 0..n-1, sorted (KPARAM_INFO / KPARAM_INFO_V2)
  unsigned param_bytes = 0;         // EIATTR_CBANK_PARAM_SIZE, else end of the last parameter
  unsigned max_threads = 0;         // x*y*z of EIATTR_MAX_THREADS, else EIATTR_REQNTID, else 0
  unsigned shared_bytes = 0;        // sh_size of .nv.shared.<name> (see the note above), else 0
  unsigned num_regs = 0;            // EIATTR_REGCOUNT, else .text sh_info >> 24 (old images)
  unsigned local_bytes = 0;         // EIATTR_FRAME_SIZE (per-thread local memory), else 0
};

struct GlobalInfo {
  std::string name;                // as in the symbol table
  std::uint64_t size = 0;          // st_size
  std::vector<std::uint8_t> init;  // initial bytes; init.size() <= size, the rest is zero
                                   // (empty for .nv.global, which has no bytes in the file)
  bool constant = false;           // __constant__ (a .nv.constant<N> section)
  bool managed = false;            // __managed__ (STO_CUDA_MANAGED)
};

struct CubinInfo {
  int sm = 0;                       // 90 for sm_90 and sm_90a
  bool arch_specific = false;       // sm_XXa: runs only on exactly that SM
  std::vector<KernelInfo> kernels;  // in symbol table order
  std::vector<GlobalInfo> globals;  // in symbol table order
  std::uint64_t image_size = 0;     // elf_extent of the image (<= the size passed)
};

inline constexpr std::uint16_t kEmCuda = 190;

// Parses an ELF cubin (e_machine EM_CUDA, ELFCLASS64, little endian). `size` bounds every
// read. Every section that has bytes in the file, the section and program header tables must
// lie within `size`. Errors: CUDA_ERROR_INVALID_IMAGE for anything malformed or truncated.
ImageResult<CubinInfo> parse_cubin(const std::uint8_t* data, std::size_t size);

// The extent of an ELF image computed from its headers only, for cuModuleLoadData, which
// gets no size: the end of the section header table, of the program header table and of every
// section with bytes in the file, whichever is last. Reads the ELF header and the header
// tables, never beyond `limit` bytes; nullopt if the header is not a CUDA ELF one or the
// extent would pass `limit`.
std::optional<std::size_t> elf_extent(const std::uint8_t* data, std::size_t limit);

// The SM of a CUDA ELF header (and its 'a' marker from e_flags only), or nullopt if `data` does
// not start with one. Reads at most 64 bytes.
struct CubinArch {
  int sm = 0;
  bool arch_specific = false;
};
std::optional<CubinArch> cubin_arch(const std::uint8_t* data, std::size_t size);

// Whether a cubin for `sm` (arch_specific: built for sm_XXa) runs on a device of `device_sm`:
// same major version and a minor version not above the device's (sm_80 runs on sm_86, not on
// sm_90); sm_XXa only on exactly sm_XX.
bool cubin_runs_on(int sm, bool arch_specific, int device_sm);

}  // namespace emu
