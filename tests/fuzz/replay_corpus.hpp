// What the *_fuzz_replay programs share: their command line ([--mutations N] [--seed S]
// <file or dir>...) and reading their corpus in a deterministic order, so the seeded
// mutations are the same on every machine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace thaw::fuzz {

struct ReplayArgs {
  long mutations = 20000;
  std::uint64_t seed = 0x7468617766757a7aull;  // "thawfuzz"
  std::vector<std::filesystem::path> paths;
};

// nullopt: bad usage (an unknown flag, or no path) — the caller prints its usage.
inline std::optional<ReplayArgs> parse_replay_args(int argc, char** argv) {
  ReplayArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      args.mutations = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      args.seed = std::strtoull(argv[++i], nullptr, 0);
    } else if (a.starts_with("-")) {
      return std::nullopt;
    } else {
      args.paths.emplace_back(a);
    }
  }
  if (args.paths.empty()) return std::nullopt;
  return args;
}

// The files named and the regular files of the directories named (those `keep` accepts),
// sorted by file name whatever the directories were called. Empty after a message when a
// path is neither a file nor a directory, or when there is no file at all.
inline std::vector<std::filesystem::path> corpus_files(
    const std::vector<std::filesystem::path>& paths, const char* program,
    const std::function<bool(const std::filesystem::path&)>& keep = {}) {
  std::vector<std::filesystem::path> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (const auto& e : std::filesystem::directory_iterator(p, ec)) {
        if (e.is_regular_file() && (!keep || keep(e.path()))) files.push_back(e.path());
      }
    } else if (std::filesystem::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: no such file or directory: %s\n", program, p.c_str());
      return {};
    }
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return std::pair(a.filename(), a) < std::pair(b.filename(), b);
  });
  if (files.empty()) std::fprintf(stderr, "%s: the corpus is empty\n", program);
  return files;
}

template <typename Bytes>
Bytes read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace thaw::fuzz
