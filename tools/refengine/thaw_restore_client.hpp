// The reference engine's use of thaw's restore ABI (--thaw-restore), as an engine that opts in
// would use it: looked up at run time with dlsym(RTLD_DEFAULT, ...), present only under
// LD_PRELOAD=libthaw-preload.so, and never required — without it the engine runs its profiling
// pass as it always does.
//
// Version 1 sizes the KV cache; version 2 adds CUDA graphs: the engine asks for each decode
// graph by its label before warming up and capturing it, and labels the capture when the answer
// is no (graph(), label_graph()). A version 1 shim gives KV sizes only.
//
// The engine includes nothing of thaw's (tests/architecture), as a third-party engine would
// not: the declarations below are its own copy of preload/include/thaw/thaw_restore.h,
// version 2. tests/preload/restore/thaw_restore_header_test.cpp checks that the two agree.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <expected>
#include <optional>
#include <string>

namespace refengine {

// thaw_restore_kv of ABI version 1.
struct ThawRestoreKv {
  std::uint32_t struct_size = sizeof(ThawRestoreKv);
  std::uint32_t reserved = 0;
  std::uint64_t kv_bytes = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_bytes = 0;
};

class ThawRestore {
 public:
  // THAW_RESTORE_* of ABI version 2 (kMismatch is version 2's).
  static constexpr std::uint32_t kAbiVersion = 2;
  static constexpr std::uint32_t kKvVersion = 1, kGraphVersion = 2;
  static constexpr int kOk = 0, kNone = 1, kStale = 2, kCorrupt = 3, kUnavailable = 4,
                       kInvalidArgument = 5, kNoLookup = 6, kMismatch = 7;
  static std::string status_name(int status);

  using VersionFn = std::uint32_t (*)();
  using LookupFn = int (*)(const char*, ThawRestoreKv*, char*, std::size_t);
  using RecordFn = int (*)(const char*, const ThawRestoreKv*, char*, std::size_t);
  using GraphFn = int (*)(const char*, unsigned long long, CUgraphExec*, char*, std::size_t);
  using GraphLabelFn = int (*)(const char*, char*, std::size_t);

  // The process's restore ABI when the shim is loaded and implements version 1 (KV sizes) or
  // later; otherwise why not (one line).
  static std::expected<ThawRestore, std::string> find();

  struct Lookup {
    int status = kUnavailable;
    ThawRestoreKv kv;
    std::string why;  // status != kOk
  };
  Lookup lookup_kv(const std::string& key) const;
  // nullopt: stored; else why not.
  std::optional<std::string> record_kv(const std::string& key, const ThawRestoreKv& kv) const;

  // Version 2: whether the shim restores graphs (why not, when it does not).
  std::optional<std::string> graphs_unsupported() const;
  struct Graph {
    int status = kUnavailable;
    CUgraphExec exec = nullptr;  // status == kOk: the engine's to launch and destroy
    std::string why;             // status != kOk
  };
  Graph graph(const std::string& label, unsigned long long instantiate_flags) const;
  // nullopt: the next capture is recorded under `label`; else why not.
  std::optional<std::string> label_graph(const std::string& label) const;

 private:
  std::uint32_t version_ = 0;
  LookupFn lookup_ = nullptr;
  RecordFn record_ = nullptr;
  GraphFn graph_ = nullptr;
  GraphLabelFn graph_label_ = nullptr;
};

}  // namespace refengine
