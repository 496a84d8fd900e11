// Module images as the graph recorder digests them: the extent of an image passed without a
// size (cubin and fatbin from their headers — checked on images nvcc built — a fatbin wrapper
// through its data pointer, PTX up to its NUL), files, and SHA-256 itself.
#include "preload/artifact/module_image.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "emu_kernels_cubins.h"

namespace {

using namespace thaw::preload;
using thaw::graphs::ImageKind;

std::span<const std::byte> span_of(const ThawCubin& c) {
  return {reinterpret_cast<const std::byte*>(c.data), c.size};
}

TEST(Sha256, KnownVectors) {
  const std::string abc = "abc";
  EXPECT_EQ(sha256_hex(std::as_bytes(std::span(abc))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ModuleImage, ACubinsExtentIsTheWholeImageNvccWrote) {
  const ThawCubin cubin = thaw_cubin_samples();
  // With bytes after it, as when the image lies inside a larger object.
  std::vector<std::byte> padded(span_of(cubin).begin(), span_of(cubin).end());
  padded.resize(padded.size() + 4096, std::byte{0x5a});
  auto image = image_in_memory(padded.data());
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ImageKind::cubin);
  EXPECT_EQ(image->bytes.size(), cubin.size);
  const auto m = recorded_module(*image);
  EXPECT_EQ(m.digest, sha256_hex(span_of(cubin)));
  EXPECT_EQ(m.bytes, cubin.size);
  EXPECT_EQ(m.kind, ImageKind::cubin);
}

TEST(ModuleImage, AFatbinsExtentComesFromItsHeaderAndAWrapperNamesIt) {
  const ThawCubin fatbin = thaw_fatbin_samples();
  auto image = image_in_memory(fatbin.data);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ImageKind::fatbin);
  EXPECT_EQ(image->bytes.size(), fatbin.size);
  struct Wrapper {
    int magic;
    int version;
    const void* data;
    void* filename_or_fatbins;
  } wrapper{0x466243B1, 1, fatbin.data, nullptr};
  auto wrapped = image_in_memory(&wrapper);
  ASSERT_TRUE(wrapped);
  EXPECT_EQ(wrapped->kind, ImageKind::fatbin);
  EXPECT_EQ(wrapped->bytes.data(), image->bytes.data());
  EXPECT_EQ(wrapped->bytes.size(), fatbin.size);
}

TEST(ModuleImage, PtxIsItsTextAndHasTheDigestOfTheSameFile) {
  const std::string ptx = "//\n.version 8.0\n.target sm_90\n.address_size 64\n";
  auto image = image_in_memory(ptx.c_str());
  ASSERT_TRUE(image);
  EXPECT_EQ(image->kind, ImageKind::ptx);
  EXPECT_EQ(image->bytes.size(), ptx.size());
  const auto path = std::filesystem::temp_directory_path() /
                    ("module_image_test_" + std::to_string(::getpid()) + ".ptx");
  std::ofstream(path) << ptx;
  auto file = file_module(path.c_str());
  std::filesystem::remove(path);
  ASSERT_TRUE(file);
  EXPECT_EQ(file->digest, recorded_module(*image).digest);
  EXPECT_EQ(file->kind, ImageKind::ptx);
}

TEST(ModuleImage, ACubinFileHasTheDigestOfTheSameImageInMemory) {
  auto file = file_module(THAW_CUBIN_PATH_samples);
  ASSERT_TRUE(file);
  EXPECT_EQ(file->kind, ImageKind::cubin);
  EXPECT_EQ(file->digest, sha256_hex(span_of(thaw_cubin_samples())));
  auto fat = file_module(THAW_FATBIN_PATH_samples);
  ASSERT_TRUE(fat);
  EXPECT_EQ(fat->kind, ImageKind::fatbin);
  EXPECT_FALSE(file_module("/nonexistent/image.cubin"));
}

TEST(ModuleImage, AnImageOfNoKnownKindIsNone) {
  const unsigned char binary[16] = {0x01, 0x02, 0x03, 0xff, 0, 0, 0, 0};
  EXPECT_FALSE(image_in_memory(binary));
  EXPECT_FALSE(image_in_memory(nullptr));
}

}  // namespace
