// The reference engine's use of thaw's restore ABI (--thaw-restore), as an engine that opts in
// would use it: looked up at run time with dlsym(RTLD_DEFAULT, ...), present only under
// LD_PRELOAD=libthaw-preload.so, and never required — without it the engine runs its profiling
// pass as it always does.
//
// The engine includes nothing of thaw's (tests/architecture), as a third-party engine would
// not: the declarations below are its own copy of preload/include/thaw/thaw_restore.h,
// version 1. tests/tools/refengine/thaw_restore_abi_test.cpp checks that the two agree.
#pragma once

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
  // THAW_RESTORE_* of ABI version 1.
  static constexpr std::uint32_t kAbiVersion = 1;
  static constexpr int kOk = 0, kNone = 1, kStale = 2, kCorrupt = 3, kUnavailable = 4,
                       kInvalidArgument = 5, kNoLookup = 6;
  static std::string status_name(int status);

  using VersionFn = std::uint32_t (*)();
  using LookupFn = int (*)(const char*, ThawRestoreKv*, char*, std::size_t);
  using RecordFn = int (*)(const char*, const ThawRestoreKv*, char*, std::size_t);

  // The process's restore ABI when the shim is loaded and implements version 1; otherwise why
  // not (one line).
  static std::expected<ThawRestore, std::string> find();

  struct Lookup {
    int status = kUnavailable;
    ThawRestoreKv kv;
    std::string why;  // status != kOk
  };
  Lookup lookup_kv(const std::string& key) const;
  // nullopt: stored; else why not.
  std::optional<std::string> record_kv(const std::string& key, const ThawRestoreKv& kv) const;

 private:
  LookupFn lookup_ = nullptr;
  RecordFn record_ = nullptr;
};

}  // namespace refengine
