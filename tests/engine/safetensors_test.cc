#include "engine/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

// Two F32 tensors "a" [2] and "b" [3] tiling 20 data bytes.
std::vector<SafetensorsEntry> TwoTensors() {
  return {{"a", DType::kF32, {2}, 0, 8}, {"b", DType::kF32, {3}, 8, 20}};
}

// Exactly the file's bytes, in a buffer of exactly that size, so that AddressSanitizer
// flags any read past the end.
std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> v(s.size());
  if (!s.empty()) std::memcpy(v.data(), s.data(), s.size());
  return v;
}

std::string File(const std::vector<SafetensorsEntry>& entries, size_t data_bytes) {
  return EncodeSafetensorsHeader(entries, {{"format", "pt"}}) + std::string(data_bytes, '\x01');
}

// A file whose header is `json` verbatim.
std::string RawFile(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + json + std::string(data_bytes, '\0');
}

absl::Status ParseStatus(const std::string& file) {
  std::vector<std::byte> b = Bytes(file);
  return ParseSafetensors(b, "m.safetensors").status();
}

TEST(SafetensorsTest, ParsesValidFileInOffsetOrder) {
  // Listed out of order: the parser sorts by offset.
  std::vector<SafetensorsEntry> entries = {{"z", DType::kBF16, {2, 2}, 8, 16},
                                           {"y", DType::kF16, {4}, 0, 8}};
  std::vector<std::byte> b = Bytes(File(entries, 16));
  absl::StatusOr<SafetensorsFile> f = ParseSafetensors(b, "m.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors.size(), 2u);
  EXPECT_EQ(f->tensors[0].name, "y");
  EXPECT_EQ(f->tensors[0].dtype, DType::kF16);
  EXPECT_EQ(f->tensors[1].name, "z");
  EXPECT_EQ(f->tensors[1].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f->tensors[1].begin, 8u);
  EXPECT_EQ(f->tensors[1].end, 16u);
  EXPECT_EQ(f->metadata.at("format"), "pt");
  EXPECT_EQ(f->data_start % 8, 0u);  // padded header
  EXPECT_EQ(f->data_start + 16, b.size());
}

TEST(SafetensorsTest, AcceptsEmptyTensorsAndNoTensors) {
  EXPECT_TRUE(ParseStatus(File({}, 0)).ok());
  EXPECT_TRUE(ParseStatus(File({{"e", DType::kF32, {0, 5}, 0, 0}}, 0)).ok());
}

TEST(SafetensorsTest, RefusesFileShorterThanLengthField) {
  for (size_t n : {0, 1, 7}) {
    absl::Status s = ParseStatus(std::string(n, '\0'));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("m.safetensors"));
    EXPECT_THAT(s.message(), HasSubstr("too short"));
  }
}

TEST(SafetensorsTest, RefusesHeaderLengthBeyondFile) {
  std::string f = File(TwoTensors(), 20);
  for (uint64_t len : {uint64_t{1} << 40, uint64_t{UINT64_MAX}, uint64_t{f.size() - 7}}) {
    for (int i = 0; i < 8; ++i) f[i] = static_cast<char>(len >> (8 * i));
    absl::Status s = ParseStatus(f);
    EXPECT_THAT(s.message(), HasSubstr("beyond the end of the file")) << len;
  }
}

TEST(SafetensorsTest, RefusesHeaderThatIsNotJson) {
  EXPECT_THAT(ParseStatus(RawFile("{\"a\": [1, 2", 0)).message(),
              HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ParseStatus(RawFile("\xff\xfe garbage", 0)).message(),
              HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ParseStatus(RawFile("[1, 2]", 0)).message(), HasSubstr("not a JSON object"));
  // Truncated header: the JSON ends exactly at the file's end.
  EXPECT_THAT(ParseStatus(RawFile("{\"a\":", 0)).message(), HasSubstr("not valid JSON"));
}

TEST(SafetensorsTest, RefusesUnknownDtype) {
  for (const char* dtype : {"Q4_0", "bool", "f32"}) {
    absl::Status s = ParseStatus(RawFile(
        std::string("{\"w\":{\"dtype\":\"") + dtype + "\",\"shape\":[1],\"data_offsets\":[0,8]}}",
        8));
    EXPECT_THAT(s.message(), HasSubstr("unknown dtype")) << dtype;
    EXPECT_THAT(s.message(), HasSubstr("\"w\"")) << dtype;
  }
}

TEST(SafetensorsTest, OtherDtypesAreParsedAsNotFloatWithTheirSizes) {
  for (const auto& [dtype, size] : std::vector<std::pair<std::string, int>>{
           {"F64", 8}, {"I64", 8}, {"U8", 1}, {"BOOL", 1}, {"I16", 2}, {"U32", 4}}) {
    auto header = [&](int bytes) {
      return "{\"w\":{\"dtype\":\"" + dtype + "\",\"shape\":[2],\"data_offsets\":[0," +
             std::to_string(bytes) + "]}}";
    };
    absl::StatusOr<SafetensorsFile> f =
        ParseSafetensors(Bytes(RawFile(header(2 * size), 2 * size)), "t");
    ASSERT_TRUE(f.ok()) << dtype << ": " << f.status();
    EXPECT_FALSE(f->tensors[0].float_dtype) << dtype;
    EXPECT_EQ(f->tensors[0].dtype_name, dtype);
    // The element size is checked as for the float dtypes.
    EXPECT_THAT(ParseStatus(RawFile(header(2 * size + 1), 2 * size + 1)).message(),
                HasSubstr("need " + std::to_string(2 * size)))
        << dtype;
  }
}

TEST(SafetensorsTest, RefusesMalformedEntries) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"w":5})", "not a JSON object"},
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "no \"dtype\""},
      {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "no \"shape\""},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "shape entry"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "shape entry"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})",
       "impossibly large"},
      // A 0 keeps the element count at 0, but a dimension past int64 is still refused.
      {R"({"w":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})",
       "impossibly large"},
      {R"({"__metadata__":{"format":1}})", "__metadata__"},
  };
  for (const auto& [json, problem] : cases) {
    EXPECT_THAT(ParseStatus(RawFile(json, 4)).message(), HasSubstr(problem)) << json;
  }
}

// The reference parser (serde) refuses a JSON object with a key twice; nlohmann keeps the
// last, so a tensor spelled twice with the same bytes was read as whichever came last: another
// dtype or shape than the one a PyTorch loader refusing the file would have.
TEST(SafetensorsTest, RefusesAKeyThatAppearsTwice) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
       "\"w\" appears twice"},
      {R"({"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
       "\"dtype\" appears twice"},
      {R"({"__metadata__":{"format":"pt","format":"np"},)"
       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "\"format\" appears twice"},
  };
  for (const auto& [json, problem] : cases) {
    const absl::Status s = ParseStatus(RawFile(json, 4));
    EXPECT_FALSE(s.ok()) << json;
    EXPECT_THAT(s.message(), HasSubstr(problem)) << json;
    EXPECT_THAT(s.message(), HasSubstr("m.safetensors")) << json;
  }
  // Nested objects of their own may reuse their keys.
  EXPECT_TRUE(ParseStatus(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                  8))
                  .ok());
}

TEST(SafetensorsTest, RefusesOffsetsOutOfRange) {
  std::vector<SafetensorsEntry> e = TwoTensors();
  e[1].begin = 12;
  e[1].end = 24;  // 4 bytes past the 20-byte data region
  EXPECT_THAT(ParseStatus(File(e, 20)).message(), HasSubstr("out of range"));
  e[1].begin = 30;  // begin > end
  EXPECT_THAT(ParseStatus(File(e, 20)).message(), HasSubstr("out of range"));
}

TEST(SafetensorsTest, RefusesSizeThatDisagreesWithShape) {
  std::vector<SafetensorsEntry> e = TwoTensors();
  e[1].shape = {2};  // 8 bytes of F32, but spans 12
  EXPECT_THAT(ParseStatus(File(e, 20)).message(), HasSubstr("spans 12 bytes"));
}

TEST(SafetensorsTest, RefusesOverlappingTensors) {
  std::vector<SafetensorsEntry> e = TwoTensors();
  e[1].begin = 4;  // [4, 16) overlaps a's [0, 8)
  e[1].end = 16;
  absl::Status s = ParseStatus(File(e, 16));
  EXPECT_THAT(s.message(), HasSubstr("overlaps"));
  EXPECT_THAT(s.message(), HasSubstr("\"b\""));
  // The same tensor bytes claimed twice.
  e[1] = {"b", DType::kF32, {2}, 0, 8};
  EXPECT_THAT(ParseStatus(File(e, 8)).message(), HasSubstr("overlaps"));
}

TEST(SafetensorsTest, RefusesGaps) {
  std::vector<SafetensorsEntry> e = TwoTensors();
  e[1].begin = 12;  // 4 unused bytes between a and b
  e[1].end = 24;
  EXPECT_THAT(ParseStatus(File(e, 24)).message(), HasSubstr("gap of 4 bytes"));
  e = {{"a", DType::kF32, {2}, 4, 12}};  // gap before the first tensor
  EXPECT_THAT(ParseStatus(File(e, 12)).message(), HasSubstr("gap of 4 bytes"));
}

TEST(SafetensorsTest, RefusesTrailingGarbage) {
  absl::Status s = ParseStatus(File(TwoTensors(), 23));
  EXPECT_THAT(s.message(), HasSubstr("trailing garbage: 3 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("m.safetensors"));
}

TEST(SafetensorsTest, EveryTruncationIsRefusedWithoutCrashing) {
  const std::string f = File(TwoTensors(), 20);
  for (size_t n = 0; n < f.size(); ++n) {
    EXPECT_FALSE(ParseStatus(f.substr(0, n)).ok()) << n;
  }
  EXPECT_TRUE(ParseStatus(f).ok());
}

}  // namespace
}  // namespace prefixd
