// preload/include/thaw/thaw_restore.h: plain C (thaw_restore_header_c.c includes it as C), and
// the reference engine's own copy of its declarations (tools/refengine/thaw_restore_client.hpp,
// which may include nothing of thaw's) agrees with it.
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>

#include "thaw/thaw_restore.h"
#include "thaw_restore_client.hpp"

extern "C" int thaw_restore_header_c_struct_size(void);

namespace {

using refengine::ThawRestore;
using refengine::ThawRestoreKv;

static_assert(sizeof(ThawRestoreKv) == sizeof(thaw_restore_kv));
static_assert(offsetof(ThawRestoreKv, struct_size) == offsetof(thaw_restore_kv, struct_size));
static_assert(offsetof(ThawRestoreKv, reserved) == offsetof(thaw_restore_kv, reserved));
static_assert(offsetof(ThawRestoreKv, kv_bytes) == offsetof(thaw_restore_kv, kv_bytes));
static_assert(offsetof(ThawRestoreKv, num_blocks) == offsetof(thaw_restore_kv, num_blocks));
static_assert(offsetof(ThawRestoreKv, block_bytes) == offsetof(thaw_restore_kv, block_bytes));
static_assert(std::is_standard_layout_v<ThawRestoreKv>);
static_assert(ThawRestore::kAbiVersion == THAW_RESTORE_ABI_VERSION);
static_assert(ThawRestore::kOk == THAW_RESTORE_OK);
static_assert(ThawRestore::kNone == THAW_RESTORE_NONE);
static_assert(ThawRestore::kStale == THAW_RESTORE_STALE);
static_assert(ThawRestore::kCorrupt == THAW_RESTORE_CORRUPT);
static_assert(ThawRestore::kUnavailable == THAW_RESTORE_UNAVAILABLE);
static_assert(ThawRestore::kInvalidArgument == THAW_RESTORE_INVALID_ARGUMENT);
static_assert(ThawRestore::kNoLookup == THAW_RESTORE_NO_LOOKUP);
static_assert(ThawRestore::kMismatch == THAW_RESTORE_MISMATCH);
// Version 2's graph calls: the header's CUgraphExec_st is cuda.h's.
static_assert(std::is_same_v<ThawRestore::GraphFn, decltype(&thaw_restore_graph)>);
static_assert(std::is_same_v<ThawRestore::GraphLabelFn, decltype(&thaw_restore_graph_label)>);
// The function types, with the engine's struct in place of the header's.
static_assert(std::is_same_v<ThawRestore::VersionFn, decltype(&thaw_restore_abi_version)>);
static_assert(std::is_same_v<ThawRestore::LookupFn,
                             int (*)(const char*, ThawRestoreKv*, char*, std::size_t)>);
static_assert(std::is_same_v<decltype(&thaw_restore_kv_lookup),
                             int (*)(const char*, thaw_restore_kv*, char*, std::size_t)>);
static_assert(std::is_same_v<ThawRestore::RecordFn,
                             int (*)(const char*, const ThawRestoreKv*, char*, std::size_t)>);
static_assert(std::is_same_v<decltype(&thaw_restore_kv_record),
                             int (*)(const char*, const thaw_restore_kv*, char*, std::size_t)>);

TEST(ThawRestoreHeader, IsTheSameStructInC) {
  EXPECT_EQ(thaw_restore_header_c_struct_size(), int(sizeof(thaw_restore_kv)));
  EXPECT_EQ(sizeof(thaw_restore_kv), 32u);
}

TEST(ThawRestoreHeader, TheEngineFindsNoAbiWithoutTheShim) {
  // This test program is not run under libthaw-preload.so.
  auto abi = ThawRestore::find();
  ASSERT_FALSE(abi);
  EXPECT_NE(abi.error().find("not in this process"), std::string::npos) << abi.error();
  EXPECT_EQ(ThawRestore::status_name(ThawRestore::kStale), "stale");
  EXPECT_EQ(ThawRestore::status_name(42), "status 42");
}

}  // namespace
