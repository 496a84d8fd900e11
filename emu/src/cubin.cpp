// ELF cubin parser; the format is described in cubin.hpp.
#include "cubin.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace emu {
namespace {

constexpr std::size_t kEhdrSize = 64;
constexpr std::size_t kShdrSize = 64;
constexpr std::size_t kPhdrSize = 56;
constexpr std::size_t kSymSize = 24;

constexpr std::uint32_t kShtNull = 0;
constexpr std::uint32_t kShtSymtab = 2;
constexpr std::uint32_t kShtStrtab = 3;
constexpr std::uint32_t kShtNobits = 8;
// ET_REL (-rdc=true) images give the CUDA sections processor-specific types. These have no
// bytes in the file, like SHT_NOBITS: .nv.global (observed), .nv.shared.* (observed) and,
// by the numbering, .nv.local.* (0x70000009, not observed).
constexpr std::uint32_t kShtCudaGlobal = 0x70000007;
constexpr std::uint32_t kShtCudaLocal = 0x70000009;
constexpr std::uint32_t kShtCudaShared = 0x7000000a;

constexpr std::uint16_t kShnLoreserve = 0xff00;
constexpr std::uint16_t kShnXindex = 0xffff;

constexpr unsigned kSttObject = 1;
constexpr unsigned kSttFunc = 2;
constexpr unsigned kSttCudaObject = 13;  // variables in ET_REL images
constexpr unsigned kStoCudaManaged = 0x04;
constexpr unsigned kStoCudaEntry = 0x10;

// .nv.info record formats and the attributes read.
constexpr std::uint8_t kEifmtNval = 0x01;
constexpr std::uint8_t kEifmtBval = 0x02;
constexpr std::uint8_t kEifmtHval = 0x03;
constexpr std::uint8_t kEifmtSval = 0x04;
constexpr std::uint8_t kEiattrMaxThreads = 0x05;
constexpr std::uint8_t kEiattrReqntid = 0x10;
constexpr std::uint8_t kEiattrFrameSize = 0x11;
constexpr std::uint8_t kEiattrKparamInfo = 0x17;
constexpr std::uint8_t kEiattrCbankParamSize = 0x19;
constexpr std::uint8_t kEiattrRegcount = 0x2f;
constexpr std::uint8_t kEiattrKparamInfoV2 = 0x45;
// .nv.compat record 0x09 (BVAL): 1 for sm_XXa images (nvcc 13.0).
constexpr std::uint8_t kCompatArchSpecific = 0x09;

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;  // little-endian host (x86-64, aarch64), as the images are
}

ImageError invalid() {
  return ImageError(CUDA_ERROR_INVALID_IMAGE);
}

// [off, off + len) lies within [0, size).
bool in_bounds(std::uint64_t off, std::uint64_t len, std::uint64_t size) {
  return off <= size && len <= size - off;
}

bool has_file_bytes(std::uint32_t type) {
  return type != kShtNull && type != kShtNobits && type != kShtCudaGlobal &&
         type != kShtCudaLocal && type != kShtCudaShared;
}

struct Shdr {
  std::uint32_t name, type;
  std::uint64_t flags, addr, offset, size;
  std::uint32_t link, info;
  std::uint64_t addralign, entsize;
};

Shdr read_shdr(const std::uint8_t* p) {
  Shdr s;
  s.name = load<std::uint32_t>(p + 0);
  s.type = load<std::uint32_t>(p + 4);
  s.flags = load<std::uint64_t>(p + 8);
  s.addr = load<std::uint64_t>(p + 16);
  s.offset = load<std::uint64_t>(p + 24);
  s.size = load<std::uint64_t>(p + 32);
  s.link = load<std::uint32_t>(p + 40);
  s.info = load<std::uint32_t>(p + 44);
  s.addralign = load<std::uint64_t>(p + 48);
  s.entsize = load<std::uint64_t>(p + 56);
  return s;
}

// The parts of the ELF header the parsers use, checked against `limit`: the header itself,
// and the section and program header tables lying within it.
struct Headers {
  CubinArch arch;
  std::uint64_t shoff = 0;
  std::uint64_t shnum = 0;
  std::uint32_t shstrndx = 0;
  std::uint64_t phoff = 0;
  std::uint64_t phnum = 0;
};

bool is_cuda_elf(const std::uint8_t* d, std::size_t size) {
  return d != nullptr && size >= kEhdrSize && d[0] == 0x7f && d[1] == 'E' && d[2] == 'L' &&
         d[3] == 'F' && d[4] == 2 /* ELFCLASS64 */ && d[5] == 1 /* ELFDATA2LSB */ &&
         load<std::uint16_t>(d + 18) == kEmCuda;
}

std::optional<Headers> read_headers(const std::uint8_t* d, std::size_t limit) {
  if (!is_cuda_elf(d, limit)) return std::nullopt;
  Headers h;
  h.arch = *cubin_arch(d, limit);
  h.phoff = load<std::uint64_t>(d + 32);
  h.shoff = load<std::uint64_t>(d + 40);
  const auto phentsize = load<std::uint16_t>(d + 54);
  h.phnum = load<std::uint16_t>(d + 56);
  const auto shentsize = load<std::uint16_t>(d + 58);
  h.shnum = load<std::uint16_t>(d + 60);
  h.shstrndx = load<std::uint16_t>(d + 62);
  if (h.shoff != 0) {
    if (shentsize != kShdrSize) return std::nullopt;
    if (!in_bounds(h.shoff, kShdrSize, limit)) return std::nullopt;
    // Extended numbering (ELF gABI): with 0xff00 or more sections e_shnum is 0 and section 0
    // holds the count in sh_size, and e_shstrndx is SHN_XINDEX with the index in sh_link.
    const Shdr first = read_shdr(d + h.shoff);
    if (h.shnum == 0) h.shnum = first.size;
    if (h.shstrndx == kShnXindex) h.shstrndx = first.link;
    if (h.shnum == 0 || h.shnum > (limit - h.shoff) / kShdrSize) return std::nullopt;
  } else {
    h.shnum = 0;
  }
  if (h.phoff != 0 && h.phnum != 0) {
    if (phentsize != kPhdrSize) return std::nullopt;
    if (h.phoff > limit || h.phnum > (limit - h.phoff) / kPhdrSize) return std::nullopt;
  } else {
    h.phnum = 0;
  }
  return h;
}

// A string of a string table section: NUL-terminated within the section.
std::optional<std::string_view> string_at(const std::uint8_t* d, std::size_t size,
                                          const Shdr& strtab, std::uint64_t off) {
  if (!has_file_bytes(strtab.type) || !in_bounds(strtab.offset, strtab.size, size)) {
    return std::nullopt;
  }
  if (off >= strtab.size) return std::nullopt;
  const char* begin = reinterpret_cast<const char*>(d + strtab.offset + off);
  const void* nul = std::memchr(begin, 0, strtab.size - off);
  if (nul == nullptr) return std::nullopt;
  return std::string_view(begin, static_cast<const char*>(nul) - begin);
}

struct InfoRecord {
  std::uint8_t format;
  std::uint8_t attr;
  std::uint16_t value;          // HVAL/BVAL value; SVAL payload size
  const std::uint8_t* payload;  // SVAL only
};

// Walks the records of a .nv.info-style section; false if one is malformed or truncated, or
// `f` returns false.
template <class F>
bool for_each_record(const std::uint8_t* d, std::size_t size, const Shdr& s, F&& f) {
  if (!has_file_bytes(s.type) || !in_bounds(s.offset, s.size, size)) return false;
  const std::uint8_t* p = d + s.offset;
  std::uint64_t left = s.size;
  while (left != 0) {
    if (left < 4) return false;
    InfoRecord r{p[0], p[1], 0, nullptr};
    switch (r.format) {
      case kEifmtNval:
        break;
      case kEifmtBval:
        r.value = p[2];
        break;
      case kEifmtHval:
        r.value = load<std::uint16_t>(p + 2);
        break;
      case kEifmtSval:
        r.value = load<std::uint16_t>(p + 2);
        if (r.value > left - 4) return false;
        r.payload = p + 4;
        break;
      default:
        return false;
    }
    const std::uint64_t len = 4 + (r.format == kEifmtSval ? r.value : 0);
    if (!f(r)) return false;
    p += len;
    left -= len;
  }
  return true;
}

unsigned dims_product(const std::uint8_t* p) {  // x*y*z, saturated
  std::uint64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    n *= load<std::uint32_t>(p + 4 * i);  // n < 2^32 before, so no overflow
    if (n > std::numeric_limits<unsigned>::max()) return std::numeric_limits<unsigned>::max();
  }
  return static_cast<unsigned>(n);
}

bool is_constant_bank(std::string_view name) {  // ".nv.constant<digits>"
  constexpr std::string_view kPrefix = ".nv.constant";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size()) return false;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::optional<CubinArch> cubin_arch(const std::uint8_t* data, std::size_t size) {
  if (!is_cuda_elf(data, size)) return std::nullopt;
  const unsigned abi = data[8];  // EI_ABIVERSION
  const auto flags = load<std::uint32_t>(data + 48);
  CubinArch a;
  if (abi >= 8) {
    a.sm = static_cast<int>((flags >> 8) & 0xff);
    a.arch_specific = (flags & 0x8) != 0;
  } else {
    a.sm = static_cast<int>(flags & 0xff);
    a.arch_specific = (flags & 0x800) != 0;
  }
  return a;
}

bool cubin_runs_on(int sm, bool arch_specific, int device_sm) {
  if (sm <= 0 || device_sm <= 0) return false;
  if (arch_specific) return sm == device_sm;
  return sm / 10 == device_sm / 10 && sm % 10 <= device_sm % 10;
}

std::optional<std::size_t> elf_extent(const std::uint8_t* data, std::size_t limit) {
  const auto h = read_headers(data, limit);
  if (!h) return std::nullopt;
  std::uint64_t end = kEhdrSize;
  if (h->shnum != 0) end = std::max(end, h->shoff + h->shnum * kShdrSize);
  if (h->phnum != 0) end = std::max(end, h->phoff + h->phnum * kPhdrSize);
  for (std::uint64_t i = 0; i < h->shnum; ++i) {
    const Shdr s = read_shdr(data + h->shoff + i * kShdrSize);
    if (!has_file_bytes(s.type)) continue;
    if (!in_bounds(s.offset, s.size, limit)) return std::nullopt;
    end = std::max(end, s.offset + s.size);
  }
  return static_cast<std::size_t>(end);
}

ImageResult<CubinInfo> parse_cubin(const std::uint8_t* data, std::size_t size) {
  const auto h = read_headers(data, size);
  if (!h) return invalid();
  const auto extent = elf_extent(data, size);  // also: every section with bytes is in bounds
  if (!extent) return invalid();
  if (h->shnum == 0 || h->shstrndx >= h->shnum) return invalid();

  std::vector<Shdr> sh(h->shnum);
  for (std::uint64_t i = 0; i < h->shnum; ++i) sh[i] = read_shdr(data + h->shoff + i * kShdrSize);
  const Shdr& shstr = sh[h->shstrndx];
  if (shstr.type != kShtStrtab) return invalid();

  // Section names; and the sections found by name.
  std::vector<std::string_view> names(sh.size());
  std::unordered_map<std::string_view, std::size_t> by_name;
  for (std::size_t i = 0; i < sh.size(); ++i) {
    auto n = string_at(data, size, shstr, sh[i].name);
    if (!n) return invalid();
    names[i] = *n;
    by_name.emplace(*n, i);  // the first of equal names
  }
  auto find = [&](std::string_view prefix, std::string_view name) -> const Shdr* {
    std::string key;
    key.reserve(prefix.size() + name.size());
    key.append(prefix).append(name);
    auto it = by_name.find(key);
    return it == by_name.end() ? nullptr : &sh[it->second];
  };

  CubinInfo info;
  info.sm = h->arch.sm;
  info.arch_specific = h->arch.arch_specific;
  info.image_size = *extent;

  if (auto it = by_name.find(".nv.compat"); it != by_name.end()) {
    const bool ok = for_each_record(data, size, sh[it->second], [&](const InfoRecord& r) {
      if (r.format == kEifmtBval && r.attr == kCompatArchSpecific && r.value != 0) {
        info.arch_specific = true;
      }
      return true;
    });
    if (!ok) return invalid();
  }

  // Symbols. An image without a symbol table has no kernels and no variables.
  const Shdr* symtab = nullptr;
  for (const Shdr& s : sh) {
    if (s.type == kShtSymtab) {
      symtab = &s;
      break;
    }
  }
  std::unordered_map<std::uint64_t, std::size_t> kernel_of_symbol;  // symbol index -> kernel
  if (symtab != nullptr) {
    if (symtab->entsize != kSymSize || symtab->link >= sh.size()) return invalid();
    if (!in_bounds(symtab->offset, symtab->size, size)) return invalid();
    const Shdr& strtab = sh[symtab->link];
    if (strtab.type != kShtStrtab) return invalid();
    std::unordered_set<std::string_view> kernel_names, global_names;
    // What is copied out of the image (names, initial bytes) stays proportional to its size,
    // whatever a crafted one does: symbols whose names are overlapping suffixes of one long
    // string, or variables that all cover the same large section, would otherwise make it
    // quadratic. A real image copies less than its own size.
    std::uint64_t budget = 2 * std::uint64_t{size} + (std::uint64_t{1} << 20);
    auto take = [&budget](std::uint64_t n) {
      if (n > budget) return false;
      budget -= n;
      return true;
    };
    const std::uint64_t nsyms = symtab->size / kSymSize;
    for (std::uint64_t i = 1; i < nsyms; ++i) {
      const std::uint8_t* p = data + symtab->offset + i * kSymSize;
      const auto st_name = load<std::uint32_t>(p);
      const unsigned type = p[4] & 0xf;
      const unsigned other = p[5];
      const auto shndx = load<std::uint16_t>(p + 6);
      const auto value = load<std::uint64_t>(p + 8);
      const auto sym_size = load<std::uint64_t>(p + 16);
      const bool is_kernel = type == kSttFunc && (other & kStoCudaEntry) != 0;
      const bool is_variable = type == kSttObject || type == kSttCudaObject;
      if (!is_kernel && !is_variable) continue;
      if (shndx == 0 || shndx >= kShnLoreserve) continue;  // undefined / special
      if (shndx >= sh.size()) return invalid();
      auto name = string_at(data, size, strtab, st_name);
      if (!name) return invalid();

      if (is_kernel) {
        if (name->empty()) return invalid();
        if (!kernel_names.insert(*name).second) continue;  // keep the first of equal names
        if (!take(name->size())) return invalid();
        KernelInfo k;
        k.name = std::string(*name);
        k.num_regs = sh[shndx].info >> 24;  // pre-CUDA-12 images; EIATTR_REGCOUNT overrides
        if (const Shdr* shared = find(".nv.shared.", *name)) {
          if (shared->size > std::numeric_limits<unsigned>::max()) return invalid();
          k.shared_bytes = static_cast<unsigned>(shared->size);
        }
        kernel_of_symbol.emplace(i, info.kernels.size());
        info.kernels.push_back(std::move(k));
        continue;
      }

      if (name->starts_with('$')) continue;  // compiler-internal, e.g. printf's `$str`
      const std::string_view sec = names[shndx];
      const bool zero_section = sec == ".nv.global";
      const bool constant = is_constant_bank(sec);
      if (!zero_section && !constant && sec != ".nv.global.init") continue;
      const Shdr& s = sh[shndx];
      if (!in_bounds(value, sym_size, s.size)) return invalid();
      if (!global_names.insert(*name).second) continue;
      if (!take(name->size())) return invalid();
      GlobalInfo g;
      g.name = std::string(*name);
      g.size = sym_size;
      g.constant = constant;
      g.managed = (other & kStoCudaManaged) != 0;
      if (!zero_section && has_file_bytes(s.type)) {
        if (!take(sym_size)) return invalid();
        const std::uint8_t* b = data + s.offset + value;  // in bounds: elf_extent checked s
        g.init.assign(b, b + sym_size);
      }
      info.globals.push_back(std::move(g));
    }
  }

  // Per-module attributes: register counts and frame sizes by symbol index.
  if (auto it = by_name.find(".nv.info"); it != by_name.end()) {
    const bool ok = for_each_record(data, size, sh[it->second], [&](const InfoRecord& r) {
      if (r.format != kEifmtSval || (r.attr != kEiattrRegcount && r.attr != kEiattrFrameSize)) {
        return true;
      }
      if (r.value != 8) return false;
      auto k = kernel_of_symbol.find(load<std::uint32_t>(r.payload));
      if (k == kernel_of_symbol.end()) return true;  // a __device__ function's
      const auto v = load<std::uint32_t>(r.payload + 4);
      (r.attr == kEiattrRegcount ? info.kernels[k->second].num_regs
                                 : info.kernels[k->second].local_bytes) = v;
      return true;
    });
    if (!ok) return invalid();
  }

  // Per-kernel attributes: parameters, parameter buffer size, launch bounds.
  for (KernelInfo& k : info.kernels) {
    const Shdr* s = find(".nv.info.", k.name);
    if (s == nullptr) continue;  // a kernel without parameters or attributes
    bool have_param_size = false;
    unsigned reqntid = 0;
    const bool ok = for_each_record(data, size, *s, [&](const InfoRecord& r) {
      switch (r.attr) {
        case kEiattrKparamInfo:
        case kEiattrKparamInfoV2: {
          if (r.format != kEifmtSval || r.value != 12) return false;
          KernelParam p;
          p.ordinal = load<std::uint16_t>(r.payload + 4);
          p.offset = load<std::uint16_t>(r.payload + 6);
          const auto tail = load<std::uint32_t>(r.payload + 8);
          p.size = r.attr == kEiattrKparamInfo ? (tail >> 18) & 0x3fff : tail;
          k.params.push_back(p);
          return true;
        }
        case kEiattrCbankParamSize:
          if (r.format != kEifmtHval) return false;
          k.param_bytes = r.value;
          have_param_size = true;
          return true;
        case kEiattrMaxThreads:
        case kEiattrReqntid:
          if (r.format != kEifmtSval || r.value != 12) return false;
          (r.attr == kEiattrMaxThreads ? k.max_threads : reqntid) = dims_product(r.payload);
          return true;
        default:
          return true;
      }
    });
    if (!ok) return invalid();
    if (k.max_threads == 0) k.max_threads = reqntid;
    std::sort(k.params.begin(), k.params.end(),
              [](const KernelParam& a, const KernelParam& b) { return a.ordinal < b.ordinal; });
    std::uint64_t end = 0;
    for (std::size_t i = 0; i < k.params.size(); ++i) {
      const KernelParam& p = k.params[i];
      if (p.ordinal != i) return invalid();  // duplicated or missing ordinal
      end = std::max(end, std::uint64_t{p.offset} + p.size);
    }
    if (have_param_size) {
      if (end > k.param_bytes) return invalid();
    } else {
      if (end > std::numeric_limits<unsigned>::max()) return invalid();
      k.param_bytes = static_cast<unsigned>(end);
    }
  }
  return info;
}

}  // namespace emu
