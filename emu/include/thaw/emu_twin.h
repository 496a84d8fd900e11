/* Host twins: how thaw's CUDA driver emulator runs a kernel.
 *
 * A real GPU runs the SASS in a cubin; the emulator loads the same cubin (names and
 * parameter layouts come from its ELF) and runs a host function, the kernel's "twin",
 * found in a kernel library named by THAW_EMU_KERNELS (several, separated by ':').
 *
 * A kernel library exports `thawEmuTwins`, returning its table of twins. Each entry
 * names a kernel by its mangled name exactly as the cubin does (`vec_add` for an
 * extern "C" kernel, `_Z5scaleIfEvPT_S0_l` for scale<float>) and gives a launcher
 * that receives the launch geometry and one pointer per kernel parameter, as
 * cuLaunchKernel's kernelParams form has them (the emulator converts the `extra`
 * buffer form using the cubin's parameter offsets).
 *
 * C++ twin sources use the helpers below: define a host function with the kernel's
 * own name and signature (so it mangles the same way), write its body in terms of
 * thaw::emu::threadIdx/blockIdx/blockDim/gridDim, and register it with
 * THAW_EMU_TWIN_PER_THREAD(fn) (called once per thread, for kernels without barriers)
 * or THAW_EMU_TWIN_PER_BLOCK(fn) (called once per block; the body loops over the
 * block's threads itself with for_each_thread, and each __syncthreads() of the kernel
 * becomes the boundary between two such loops).
 */
#ifndef THAW_EMU_TWIN_H
#define THAW_EMU_TWIN_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ThawEmuDim3 {
  unsigned x, y, z;
} ThawEmuDim3;

typedef struct ThawEmuLaunch {
  ThawEmuDim3 grid;
  ThawEmuDim3 block;
  unsigned shared_mem_bytes;
  unsigned num_params;
  void* const* params; /* params[i] points at parameter i's bytes */
} ThawEmuLaunch;

typedef void (*ThawEmuTwinLauncher)(const ThawEmuLaunch* launch);

typedef struct ThawEmuTwin {
  const char* kernel; /* mangled name, as in the cubin */
  ThawEmuTwinLauncher launcher;
  /* Optional: modelled device time of one launch in nanoseconds (0: launch latency only). */
  double (*model_ns)(const ThawEmuLaunch* launch);
} ThawEmuTwin;

/* Exported by a kernel library. */
const ThawEmuTwin* thawEmuTwins(unsigned* count);

#ifdef __cplusplus
}

#include <dlfcn.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// Hidden: every kernel library (and the emulator) has its own registry and index variables.
// With default visibility g++ makes these vague-linkage objects STB_GNU_UNIQUE, which the
// dynamic linker binds process-wide even under RTLD_LOCAL: a second library in
// THAW_EMU_KERNELS would register into the first one's vector (reallocating it under the
// emulator's pointers) and export both libraries' twins.
#pragma GCC visibility push(hidden)
namespace thaw::emu {

// The index variables of the thread the twin is running as.
inline thread_local ThawEmuDim3 threadIdx{0, 0, 0};
inline thread_local ThawEmuDim3 blockIdx{0, 0, 0};
inline thread_local ThawEmuDim3 blockDim{1, 1, 1};
inline thread_local ThawEmuDim3 gridDim{1, 1, 1};

// Runs `body` once for every thread of the current block, setting threadIdx.
template <class F>
void for_each_thread(F&& body) {
  for (unsigned z = 0; z < blockDim.z; ++z)
    for (unsigned y = 0; y < blockDim.y; ++y)
      for (unsigned x = 0; x < blockDim.x; ++x) {
        threadIdx = {x, y, z};
        body();
      }
}

namespace detail {

template <class... A, std::size_t... I>
void call(void (*fn)(A...), void* const* params, std::index_sequence<I...>) {
  fn(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}

template <class... A>
void call(void (*fn)(A...), void* const* params) {
  call(fn, params, std::index_sequence_for<A...>{});
}

template <class... A>
constexpr unsigned arity(void (*)(A...)) {
  return sizeof...(A);
}

template <class F>
void for_each_block(const ThawEmuLaunch* l, F&& body) {
  gridDim = l->grid;
  blockDim = l->block;
  for (unsigned z = 0; z < l->grid.z; ++z)
    for (unsigned y = 0; y < l->grid.y; ++y)
      for (unsigned x = 0; x < l->grid.x; ++x) {
        blockIdx = {x, y, z};
        body();
      }
}

inline std::vector<ThawEmuTwin>& registry() {
  static std::vector<ThawEmuTwin> r;
  return r;
}

// The mangled name of a function of this library: what the cubin calls the kernel.
inline const char* mangled_name(const void* fn) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_sname == nullptr) return nullptr;
  return info.dli_sname;
}

struct Registrar {
  Registrar(const void* fn, ThawEmuTwinLauncher launcher) {
    registry().push_back(ThawEmuTwin{mangled_name(fn), launcher, nullptr});
  }
};

}  // namespace detail

template <auto Fn>
void run_per_thread(const ThawEmuLaunch* l) {
  detail::for_each_block(l, [&] { for_each_thread([&] { detail::call(Fn, l->params); }); });
}

template <auto Fn>
void run_per_block(const ThawEmuLaunch* l) {
  detail::for_each_block(l, [&] {
    threadIdx = {0, 0, 0};
    detail::call(Fn, l->params);
  });
}

}  // namespace thaw::emu
#pragma GCC visibility pop

#define THAW_EMU_CONCAT_(a, b) a##b
#define THAW_EMU_CONCAT(a, b) THAW_EMU_CONCAT_(a, b)
#define THAW_EMU_TWIN_PER_THREAD(...)                                              \
  static ::thaw::emu::detail::Registrar THAW_EMU_CONCAT(thaw_emu_twin_, __LINE__)( \
      reinterpret_cast<const void*>(&__VA_ARGS__), &::thaw::emu::run_per_thread<&__VA_ARGS__>)
#define THAW_EMU_TWIN_PER_BLOCK(...)                                               \
  static ::thaw::emu::detail::Registrar THAW_EMU_CONCAT(thaw_emu_twin_, __LINE__)( \
      reinterpret_cast<const void*>(&__VA_ARGS__), &::thaw::emu::run_per_block<&__VA_ARGS__>)
// Once per kernel library: exports the table.
#define THAW_EMU_TWIN_LIBRARY()                                             \
  extern "C" const ThawEmuTwin* thawEmuTwins(unsigned* count) {             \
    *count = static_cast<unsigned>(::thaw::emu::detail::registry().size()); \
    return ::thaw::emu::detail::registry().data();                          \
  }

#endif /* __cplusplus */
#endif /* THAW_EMU_TWIN_H */
