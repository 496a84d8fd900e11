// Checks every FetchPlan must pass, shared by the plan tests on synthesised and generated
// models: well-formed ranges, and the tensors each range names lying inside it.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/safetensors/fetch_plan.hpp"

namespace thaw::safetensors::testing {

inline void expect_well_formed(const Model& model, const FetchPlan& plan) {
  // Small files first, config.json leading, each whole.
  std::size_t i = 0;
  for (; i < plan.files.size() && plan.files[i].whole; ++i) {
    const FileFetch& f = plan.files[i];
    if (f.size > 0) {
      ASSERT_EQ(f.ranges.size(), 1u) << f.file;
      EXPECT_EQ(f.ranges[0].begin, 0u);
      EXPECT_EQ(f.ranges[0].end, f.size);
    }
  }
  EXPECT_EQ(i, model.small_files().size());
  if (i > 0 && model.config()) {
    EXPECT_EQ(plan.files[0].file, "config.json");
  }
  // Then every weight file, in model order, header first.
  ASSERT_EQ(plan.files.size() - i, model.shards().size());
  for (std::size_t s = 0; s < model.shards().size(); ++s) {
    const Header& h = model.shards()[s];
    const FileFetch& f = plan.files[i + s];
    SCOPED_TRACE(f.file);
    EXPECT_EQ(f.file, h.file());
    EXPECT_EQ(f.size, h.file_size());
    EXPECT_FALSE(f.whole);
    ASSERT_GE(f.ranges.size(), 1u);
    EXPECT_EQ(f.ranges[0].begin, 0u);
    EXPECT_EQ(f.ranges[0].end, h.data_begin());
    for (std::size_t r = 1; r < f.ranges.size(); ++r) {
      const ByteRange& range = f.ranges[r];
      EXPECT_LT(range.begin, range.end);
      EXPECT_LE(f.ranges[r - 1].end, range.begin);
      // Adjacent tensor ranges are merged.
      if (r > 1) {
        EXPECT_LT(f.ranges[r - 1].end, range.begin);
      }
      EXPECT_LE(range.end, h.file_size());
      // The named tensors tile the range exactly, in file order.
      ASSERT_FALSE(range.tensors.empty());
      std::uint64_t at = range.begin;
      for (const std::string& name : range.tensors) {
        const TensorInfo* t = h.find(name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_EQ(t->begin, at) << name;
        at = t->end;
      }
      EXPECT_EQ(at, range.end);
    }
    for (const std::string& name : f.ranges[0].tensors) {
      ASSERT_NE(h.find(name), nullptr) << name;
      EXPECT_EQ(h.find(name)->bytes(), 0u) << name;
    }
  }
}

// How many of `plans` cover each tensor.
inline std::map<std::string, int> coverage(const std::vector<FetchPlan>& plans) {
  std::map<std::string, int> count;
  for (const FetchPlan& p : plans) {
    for (const std::string& t : p.tensors()) ++count[t];
  }
  return count;
}

}  // namespace thaw::safetensors::testing
