#include "host_mapping.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace emu {

std::optional<HostMapping> find_host_mapping(std::uint64_t address) {
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return std::nullopt;
  std::optional<HostMapping> found;
  char line[4096 + 256];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    std::uint64_t begin = 0, end = 0, offset = 0;
    char perms[8] = {};
    int path_at = 0;
    // "begin-end perms offset dev inode   path"
    if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %*s %*s %n", &begin, &end, perms,
                    &offset, &path_at) < 4)
      continue;
    if (address < begin || address >= end) continue;
    HostMapping m;
    m.shared = perms[3] == 's';
    m.offset = offset + (address - begin);
    std::string path = line + path_at;
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    m.path = std::move(path);
    found = std::move(m);
    break;
  }
  std::fclose(maps);
  return found;
}

}  // namespace emu
