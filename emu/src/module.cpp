#include "module.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace emu {
namespace {

struct TwinRegistry {
  std::unordered_map<std::string, const ThawEmuTwin*> twins;
  std::string paths;
};

const TwinRegistry& registry() {
  static TwinRegistry* r = [] {
    auto* reg = new TwinRegistry();
    const char* env = std::getenv("THAW_EMU_KERNELS");
    if (env == nullptr) return reg;
    reg->paths = env;
    std::stringstream ss(env);
    std::string path;
    while (std::getline(ss, path, ':')) {
      if (path.empty()) continue;
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        std::fprintf(stderr, "thaw-emu: cannot load kernel library '%s' (THAW_EMU_KERNELS): %s\n",
                     path.c_str(), dlerror());
        continue;
      }
      auto table = reinterpret_cast<const ThawEmuTwin* (*)(unsigned*)>(dlsym(h, "thawEmuTwins"));
      if (table == nullptr) {
        std::fprintf(stderr,
                     "thaw-emu: kernel library '%s' exports no thawEmuTwins (see "
                     "thaw/emu_twin.h)\n",
                     path.c_str());
        continue;
      }
      unsigned n = 0;
      const ThawEmuTwin* twins = table(&n);
      for (unsigned i = 0; i < n; ++i) {
        if (twins[i].kernel != nullptr) reg->twins.emplace(twins[i].kernel, &twins[i]);
      }
    }
    return reg;
  }();
  return *r;
}

}  // namespace

const ThawEmuTwin* find_twin(const std::string& kernel) {
  const auto& r = registry();
  auto it = r.twins.find(kernel);
  return it == r.twins.end() ? nullptr : it->second;
}

std::string twin_libraries() {
  const auto& r = registry();
  return r.paths.empty() ? "(THAW_EMU_KERNELS is not set)" : r.paths;
}

ModuleTables& module_tables() {
  static auto* t = new ModuleTables();
  return *t;
}

bool lazy_loading() {
  const char* v = std::getenv("CUDA_MODULE_LOADING");
  return v == nullptr || std::string(v) != "EAGER";
}

}  // namespace emu
