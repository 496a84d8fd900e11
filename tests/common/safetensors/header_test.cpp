// The safetensors header rules (common/safetensors/header_parser.hpp), one test per rule, on
// files built byte by byte. Where the official implementation has a test for a rule
// (huggingface/safetensors safetensors/src/tensor.rs), the same bytes are used here.
#include "common/safetensors/header.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "builder.hpp"
#include "temp_dir.hpp"

namespace thaw::safetensors {
namespace {

using testing::file_with_header;
using testing::FileBuilder;
using ::testing::HasSubstr;
using testing::le64;

std::expected<Header, Error> parse(std::string_view file, std::string_view name = "m.safetensors") {
  return parse_header(file, file.size(), name);
}

// The error code of parsing `file`, with the message shown when the test fails.
errc code_of(std::string_view file) {
  const auto h = parse(file);
  if (h) {
    ADD_FAILURE() << "parsed, expected an error";
    return errc{};
  }
  SCOPED_TRACE(h.error().message);
  return h.error().code;
}

MATCHER_P(Fails, code, "") {
  if (arg) {
    *result_listener << "parsed without error";
    return false;
  }
  *result_listener << "error " << errc_name(arg.error().code) << ": " << arg.error().message;
  return arg.error().code == code;
}

// ---- A well-formed file. ----

TEST(SafetensorsHeader, ParsesTensorsMetadataAndAbsoluteRanges) {
  const std::string file = FileBuilder()
                               .metadata("format", "pt")
                               .tensor("b", "F32", {2, 3})
                               .tensor("a", "BF16", {4})
                               .build();
  const auto h = parse(file, "model-00001-of-00002.safetensors");
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->file(), "model-00001-of-00002.safetensors");
  const std::uint64_t n = h->header_size();
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(h->data_begin(), 8 + n);
  EXPECT_EQ(h->file_size(), file.size());
  EXPECT_EQ(h->data_size(), 24u + 8u);
  ASSERT_EQ(h->tensors().size(), 2u);
  const TensorInfo& b = h->tensors()[0];
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.dtype, Dtype::F32);
  EXPECT_EQ(b.shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(b.begin, 8 + n);
  EXPECT_EQ(b.end, 8 + n + 24);
  EXPECT_EQ(b.elements(), 6u);
  EXPECT_EQ(h->find("a")->begin, 8 + n + 24);
  EXPECT_EQ(h->find("a")->bytes(), 8u);
  EXPECT_EQ(h->find("c"), nullptr);
  EXPECT_EQ(h->metadata().at("format"), "pt");
}

TEST(SafetensorsHeader, OfficialDeserializationExample) {
  // tensor.rs test_deserialization: N = 60, no padding, 16 data bytes.
  const std::string file = le64(60) +
                           R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" +
                           std::string(16, '\0');
  const auto h = parse(file);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->find("test")->begin, 68u);
  EXPECT_EQ(h->find("test")->end, 84u);
}

TEST(SafetensorsHeader, ReturnsTensorsInFileOrderWhateverTheJsonOrder) {
  const std::string file =
      file_with_header(R"({"z":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},)"
                       R"("m":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                       8);
  const auto h = parse(file);
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->tensors().size(), 3u);
  EXPECT_EQ(h->tensors()[0].name, "z");
  EXPECT_EQ(h->tensors()[1].name, "m");
  EXPECT_EQ(h->tensors()[2].name, "a");
}

TEST(SafetensorsHeader, EmptyHeaderWithNoDataIsAFile) {
  const auto h = parse(file_with_header("{}", 0));
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_TRUE(h->tensors().empty());
  EXPECT_EQ(h->data_size(), 0u);
}

// ---- Length prefix. ----

TEST(SafetensorsHeader, FileShorterThanTheLengthPrefixIsTruncated) {
  EXPECT_EQ(code_of(""), errc::truncated);  // tensor.rs test_header_too_small
  EXPECT_EQ(code_of(std::string("\x02\0\0\0", 4)), errc::truncated);
}

TEST(SafetensorsHeader, HeaderLongerThanTheFileIsTruncated) {
  // tensor.rs test_invalid_header_length: N = 60, nothing after the prefix.
  const auto h = parse(le64(60));
  ASSERT_THAT(h, Fails(errc::truncated));
  EXPECT_THAT(h.error().message, HasSubstr("header length 60 needs 68 bytes but the file holds 8"));
}

TEST(SafetensorsHeader, HeaderAbove100MBIsRefused) {
  const std::uint64_t huge = 100'000'001;
  const auto n = header_length(std::as_bytes(std::span(le64(huge).data(), 8)), 1ull << 40, "f");
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error().code, errc::header_too_large);
  EXPECT_THAT(n.error().message, HasSubstr("100000001"));
  // tensor.rs test_header_too_large: the high bytes set.
  EXPECT_EQ(code_of(std::string("<\0\0\0\0\xff\xff\xff", 8) + "{}"), errc::header_too_large);
  // Exactly the limit is allowed.
  const auto ok =
      header_length(std::as_bytes(std::span(le64(100'000'000).data(), 8)), 100'000'008, "f");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(*ok, 100'000'000u);
}

TEST(SafetensorsHeader, ParsesFromAPrefixBeforeTheDataArrives) {
  const std::string file = FileBuilder().tensor("w", "F16", {1000}).build();
  const std::uint64_t n =
      *header_length(std::as_bytes(std::span(file.data(), 8)), file.size(), "f");
  const std::string prefix = file.substr(0, 8 + n);
  const auto h = parse_header(prefix, file.size(), "f");
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->find("w")->end, file.size());
  // A prefix shorter than 8 + N is refused, not read past.
  EXPECT_THAT(parse_header(prefix.substr(0, prefix.size() - 1), file.size(), "f"),
              Fails(errc::truncated));
}

// ---- The header text. ----

TEST(SafetensorsHeader, InvalidUtf8IsRefused) {
  EXPECT_EQ(code_of(std::string("\x01\0\0\0\0\0\0\0\xff", 9)), errc::invalid_utf8);  // tensor.rs
  // Overlong '/', a UTF-16 surrogate, a truncated sequence: inside a metadata string.
  for (const std::string bad : {"\xc0\xaf", "\xed\xa0\x80", "\xe2\x82"}) {
    const std::string file = file_with_header(R"({"__metadata__":{"k":")" + bad + R"("}})", 0);
    EXPECT_EQ(code_of(file), errc::invalid_utf8);
  }
}

TEST(SafetensorsHeader, MultibyteUtf8IsAccepted) {
  const std::string file = FileBuilder()
                               .metadata("author", "J\xc3\xa9r\xc3\xb4me \xf0\x9f\x98\x80")
                               .tensor("\xce\xb1", "U8", {1})
                               .build();
  const auto h = parse(file);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_NE(h->find("\xce\xb1"), nullptr);
}

TEST(SafetensorsHeader, InvalidJsonIsRefused) {
  EXPECT_EQ(code_of(le64(1) + "{"), errc::invalid_json);  // tensor.rs test_invalid_header_not_json
  EXPECT_EQ(code_of(file_with_header("[]", 0)), errc::invalid_json);
  EXPECT_EQ(code_of(file_with_header("\"x\"", 0)), errc::invalid_json);
  EXPECT_EQ(code_of(file_with_header("{}x", 0)), errc::invalid_json);
  EXPECT_EQ(code_of(file_with_header("{} {}", 0)), errc::invalid_json);
  EXPECT_EQ(code_of(file_with_header("", 0)), errc::invalid_json);
  EXPECT_EQ(code_of(file_with_header("{\"__metadata__\":{},}", 0)), errc::invalid_json);
}

TEST(SafetensorsHeader, NulPaddingIsRefused) {
  // A JSON reader that stops at NUL would accept this; serde_json does not.
  const auto h = parse(file_with_header(std::string("{}\0\0\0\0\0\0", 8), 0));
  ASSERT_THAT(h, Fails(errc::invalid_json));
  EXPECT_THAT(h.error().message, HasSubstr("NUL byte at offset 2"));
}

TEST(SafetensorsHeader, ByteOrderMarkIsRefused) {
  EXPECT_EQ(code_of(file_with_header("\xef\xbb\xbf{}", 0)), errc::invalid_json);
}

TEST(SafetensorsHeader, WhitespacePaddingIsAccepted) {
  // tensor.rs test_whitespace_padded_header and test_whitespace_leading_padded_header.
  EXPECT_TRUE(parse(file_with_header("{}\x0d\x20\x09\x0a", 0)));
  EXPECT_TRUE(parse(file_with_header("\x09\x0a{}\x0d\x20", 0)));
}

TEST(SafetensorsHeader, NestingDeeperThanSerdeAllowsIsRefused) {
  // Only an ignored field can nest at all; 200 levels is past serde_json's limit of 128.
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  const std::string file = file_with_header(
      R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":)" + deep + "}}", 1);
  EXPECT_EQ(code_of(file), errc::invalid_json);
}

// ---- Keys and entries. ----

TEST(SafetensorsHeader, DuplicateKeysAreRefused) {
  const std::string entry = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_EQ(code_of(file_with_header(R"({"t":)" + entry + R"(,"t":)" + entry + "}", 1)),
            errc::duplicate_key);
  EXPECT_EQ(code_of(file_with_header(
                R"({"t":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1)),
            errc::duplicate_key);
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":{"k":"a","k":"b"}})", 0)),
            errc::duplicate_key);
}

TEST(SafetensorsHeader, MalformedEntriesAreRefused) {
  const auto entry = [](std::string_view body) {
    return file_with_header(std::string(R"({"t":)") + std::string(body) + "}", 4);
  };
  EXPECT_EQ(code_of(entry("[1]")), errc::invalid_entry);
  EXPECT_EQ(code_of(entry("7")), errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"shape":[4],"data_offsets":[0,4]})")), errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","data_offsets":[0,4]})")), errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[4]})")), errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":8,"shape":[4],"data_offsets":[0,4]})")), errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":4,"data_offsets":[0,4]})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[-4],"data_offsets":[0,4]})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[4.0],"data_offsets":[0,4]})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[[4]],"data_offsets":[0,4]})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[4]})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4,4]})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[4],"data_offsets":{"begin":0}})")),
            errc::invalid_entry);
  EXPECT_EQ(code_of(entry(R"({"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,4]})")),
            errc::invalid_entry);
  const auto h = parse(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[0]})"));
  ASSERT_THAT(h, Fails(errc::invalid_entry));
  EXPECT_THAT(h.error().message,
              HasSubstr("m.safetensors: tensor 't': \"data_offsets\" has 1 value, not 2"));
}

TEST(SafetensorsHeader, UnknownEntryFieldsAreIgnoredLikeTheOfficialParser) {
  // serde ignores fields TensorInfo does not declare; so does thaw, whatever their value.
  const std::string file = file_with_header(
      R"({"t":{"dtype":"U8","extra":{"a":[1,{"b":null}]},"shape":[2],"data_offsets":[0,2],"n":1}})",
      2);
  const auto h = parse(file);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->find("t")->bytes(), 2u);
}

TEST(SafetensorsHeader, UnknownDtypeIsRefused) {
  for (const std::string dtype : {"F33", "f32", "FLOAT", ""}) {
    const auto h = parse(FileBuilder().tensor_at("w", dtype, {1}, 0, 4).build());
    ASSERT_THAT(h, Fails(errc::unknown_dtype));
    EXPECT_THAT(h.error().message, HasSubstr("tensor 'w': dtype '" + dtype + "'"));
  }
}

TEST(SafetensorsHeader, EveryDtypeOfTheSpecHasItsSize) {
  // One tensor of 8 elements per dtype; 8 elements is a whole number of bytes for all of them.
  const std::vector<std::pair<std::string, std::uint64_t>> bytes_of_8 = {
      {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
      {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
      {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
      {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
      {"I64", 64},        {"U64", 64},
  };
  FileBuilder b;
  for (const auto& [dtype, bytes] : bytes_of_8) b.tensor(dtype, dtype, {2, 4});
  const auto h = parse(b.build());
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->tensors().size(), bytes_of_8.size());
  for (const auto& [dtype, bytes] : bytes_of_8) {
    const TensorInfo* t = h->find(dtype);
    ASSERT_NE(t, nullptr) << dtype;
    EXPECT_EQ(dtype_name(t->dtype), dtype);
    EXPECT_EQ(t->bytes(), bytes) << dtype;
    EXPECT_EQ(dtype_bits(t->dtype), bytes) << dtype;  // 8 elements: bits == bytes
  }
  EXPECT_EQ(std::size(kAllDtypes), bytes_of_8.size());
}

TEST(SafetensorsHeader, SubByteTensorsMustBeWholeBytes) {
  // tensor.rs test_serialization_fp4: F4 [1, 2] is one byte.
  EXPECT_TRUE(parse(FileBuilder().tensor("w", "F4", {1, 2}).build()));
  EXPECT_TRUE(parse(FileBuilder().tensor("w", "F6_E2M3", {4}).build()));
  // F4 [3] is 12 bits, F6 [3] 18: not whole bytes (MisalignedSlice).
  const auto h = parse(FileBuilder().tensor_at("w", "F4", {3}, 0, 2).build());
  ASSERT_THAT(h, Fails(errc::misaligned_size));
  EXPECT_THAT(h.error().message, HasSubstr("shape [3] of F4 is 12 bits"));
  EXPECT_THAT(parse(FileBuilder().tensor_at("w", "F6_E3M2", {3}, 0, 3).build()),
              Fails(errc::misaligned_size));
}

// ---- Metadata. ----

TEST(SafetensorsHeader, MetadataMustMapStringsToStrings) {
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":{"k":1}})", 0)), errc::metadata_not_string);
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":{"k":null}})", 0)),
            errc::metadata_not_string);
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":{"k":{"a":"b"}}})", 0)),
            errc::metadata_not_string);
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":{"k":["a"]}})", 0)),
            errc::metadata_not_string);
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":["a"]})", 0)), errc::metadata_not_string);
  EXPECT_EQ(code_of(file_with_header(R"({"__metadata__":"a"})", 0)), errc::metadata_not_string);
  const auto h = parse(file_with_header(R"({"__metadata__":{"a":"1","b":""}})", 0));
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->metadata().size(), 2u);
}

TEST(SafetensorsHeader, NullMetadataIsNoMetadata) {
  // The official parser reads "__metadata__" as Option<HashMap>: null is None.
  const auto h = parse(file_with_header(R"({"__metadata__":null})", 0));
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_TRUE(h->metadata().empty());
}

// ---- Offsets: sorted, no gap, no overlap, full coverage. ----

TEST(SafetensorsHeader, GapBeforeTheFirstTensorIsRefused) {
  const auto h = parse(FileBuilder().tensor_at("w", "U8", {4}, 4, 8).build());
  ASSERT_THAT(h, Fails(errc::offsets_gap));
  EXPECT_THAT(h.error().message, HasSubstr("bytes [0, 4) belong to no tensor"));
}

TEST(SafetensorsHeader, GapBetweenTensorsIsRefused) {
  const auto h =
      parse(FileBuilder().tensor_at("a", "U8", {4}, 0, 4).tensor_at("b", "U8", {4}, 6, 10).build());
  ASSERT_THAT(h, Fails(errc::offsets_gap));
  EXPECT_THAT(h.error().message,
              HasSubstr("tensor 'b': data_offsets [6, 10) start at 6 but tensor 'a' ends at 4: "
                        "bytes [4, 6) of the data section belong to no tensor"));
}

TEST(SafetensorsHeader, OverlappingTensorsAreRefused) {
  const auto h =
      parse(FileBuilder().tensor_at("a", "U8", {8}, 0, 8).tensor_at("b", "U8", {8}, 4, 12).build());
  ASSERT_THAT(h, Fails(errc::offsets_overlap));
  EXPECT_THAT(h.error().message,
              HasSubstr("tensor 'b': data_offsets [4, 12) overlap tensor 'a' at [0, 8)"));
  // tensor.rs test_json_attack: ten tensors all at [0, 16).
  FileBuilder same;
  for (int i = 0; i < 10; ++i) same.tensor_at("weight_" + std::to_string(i), "F32", {2, 2}, 0, 16);
  EXPECT_EQ(code_of(same.build()), errc::offsets_overlap);
}

TEST(SafetensorsHeader, ReversedOffsetsAreRefused) {
  EXPECT_EQ(code_of(FileBuilder().tensor_at("w", "U8", {0}, 4, 0).data_bytes(4).build()),
            errc::offsets_reversed);
}

TEST(SafetensorsHeader, ZeroSizedTensorsAreAllowed) {
  // tensor.rs test_zero_sized_tensor / test_empty_shapes_allowed.
  const std::string file = FileBuilder()
                               .tensor("empty", "I32", {2, 0})
                               .tensor("scalar", "I32", {})
                               .tensor("also_empty", "F16", {0})
                               .build();
  const auto h = parse(file);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->find("empty")->bytes(), 0u);
  EXPECT_EQ(h->find("scalar")->bytes(), 4u);
  EXPECT_EQ(h->find("scalar")->elements(), 1u);
}

TEST(SafetensorsHeader, TensorPastTheEndOfTheFileIsOutOfBounds) {
  // tensor.rs test_metadata_incomplete_buffer, second case: two data bytes missing.
  const auto h = parse(FileBuilder().tensor("test", "I32", {2, 2}).data_bytes(14).build());
  ASSERT_THAT(h, Fails(errc::out_of_bounds));
  EXPECT_THAT(h.error().message,
              HasSubstr("tensor 'test': data_offsets [0, 16) end past the data section, which "
                        "holds 14 bytes"));
}

TEST(SafetensorsHeader, TrailingBytesAreRefused) {
  // tensor.rs test_metadata_incomplete_buffer: a polyglot file with bytes after the data.
  const auto h = parse(FileBuilder().tensor("test", "I32", {2, 2}).build() +
                       "extra_bogus_data_for_polyglot_file");
  ASSERT_THAT(h, Fails(errc::trailing_bytes));
  EXPECT_THAT(h.error().message, HasSubstr("34 trailing bytes"));
  EXPECT_EQ(code_of(file_with_header("{}", 1)), errc::trailing_bytes);
}

// ---- Shape x dtype = byte size. ----

TEST(SafetensorsHeader, ShapeProductOverflowIsRefused) {
  // tensor.rs test_validation_overflow: both the element count and the bit count overflow.
  EXPECT_EQ(
      code_of(FileBuilder().tensor_at("test", "I32", {2, 18446744073709551614ull}, 0, 16).build()),
      errc::shape_overflow);
  EXPECT_EQ(
      code_of(FileBuilder().tensor_at("test", "I32", {2, 9223372036854775807ull}, 0, 16).build()),
      errc::shape_overflow);
  // 2^62 elements fit, 2^62 x 32 bits do not.
  EXPECT_EQ(code_of(FileBuilder().tensor_at("test", "F32", {1ull << 62}, 0, 16).build()),
            errc::shape_overflow);
  // An overflow before a zero dimension still counts, as in the official checked product.
  EXPECT_EQ(code_of(FileBuilder().tensor_at("test", "U8", {1ull << 63, 4, 0}, 0, 0).build()),
            errc::shape_overflow);
}

TEST(SafetensorsHeader, SizeMismatchNamesFileTensorAndNumbers) {
  const auto h = parse_header(
      FileBuilder().tensor_at("h.0.attn.c_attn.weight", "F32", {3, 5}, 0, 100).build(),
      FileBuilder().tensor_at("h.0.attn.c_attn.weight", "F32", {3, 5}, 0, 100).build().size(),
      "model-00001-of-00002.safetensors");
  ASSERT_THAT(h, Fails(errc::size_mismatch));
  EXPECT_EQ(h.error().message,
            "model-00001-of-00002.safetensors: tensor 'h.0.attn.c_attn.weight': data_offsets "
            "[0, 100) hold 100 bytes but shape [3, 5] of F32 needs 60");
  // tensor.rs test_invalid_info: [2, 2] I32 in 4 bytes.
  EXPECT_EQ(code_of(FileBuilder().tensor_at("test", "I32", {2, 2}, 0, 4).build()),
            errc::size_mismatch);
}

// ---- Messages and codes. ----

TEST(SafetensorsHeader, MessagesEscapeAndShortenHostileNames) {
  const auto h =
      parse(FileBuilder()
                .tensor_at(std::string("a\\u0001'b") + std::string(1000, 'x'), "U8", {2}, 0, 3)
                .build());
  ASSERT_THAT(h, Fails(errc::size_mismatch));
  EXPECT_THAT(h.error().message, HasSubstr("tensor 'a\\x01\\'bxxx"));
  EXPECT_THAT(h.error().message, HasSubstr("...' (1004 bytes)"));
  EXPECT_LT(h.error().message.size(), 400u);
  EXPECT_EQ(h.error().message.find('\n'), std::string::npos);
}

TEST(SafetensorsHeader, ErrorCodesConvertToStdErrorCode) {
  const std::error_code ec = errc::offsets_gap;
  EXPECT_EQ(ec.category().name(), std::string("thaw.safetensors"));
  EXPECT_EQ(ec.message(), "offsets_gap");
  const Error e{errc::trailing_bytes, ""};
  EXPECT_EQ(e.error_code(), errc::trailing_bytes);
}

// ---- Reading files. ----

TEST(SafetensorsHeader, ReadsAFileReadingOnlyItsHeader) {
  testing::TempDir dir;
  const std::string file = FileBuilder().metadata("format", "pt").tensor("w", "F32", {64}).build();
  testing::write_file(dir.path() / "model.safetensors", file);
  const auto h = read_header(dir.path() / "model.safetensors");
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->file(), (dir.path() / "model.safetensors").string());
  EXPECT_EQ(h->find("w")->end, file.size());
  const auto named = read_header(dir.path() / "model.safetensors", "model.safetensors");
  ASSERT_TRUE(named);
  EXPECT_EQ(named->file(), "model.safetensors");
}

TEST(SafetensorsHeader, ReadErrorsNameTheFile) {
  testing::TempDir dir;
  const auto missing = read_header(dir.path() / "absent.safetensors");
  ASSERT_THAT(missing, Fails(errc::io));
  EXPECT_THAT(missing.error().message, HasSubstr("absent.safetensors: open: No such file"));
  EXPECT_THAT(read_header(dir.path()), Fails(errc::io));
  testing::write_file(dir.path() / "short.safetensors",
                      FileBuilder().tensor("w", "F32", {64}).build().substr(0, 100));
  const auto cut = read_header(dir.path() / "short.safetensors", "short.safetensors");
  ASSERT_FALSE(cut);
  EXPECT_THAT(cut.error().message, HasSubstr("short.safetensors: "));
}

}  // namespace
}  // namespace thaw::safetensors
