// A refusal in a front end's vocabulary (server/wire_field.h): parse errors name their wire
// field; a request rule's refusal gets the front end's name for its field put first.
#include "server/wire_field.h"

#include <string>
#include <string_view>

#include "engine/request_validation.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

std::string_view Names(RequestField f) {
  return f == RequestField::kNumSamples ? std::string_view("n") : std::string_view("other");
}

TEST(WireFieldTest, ParseErrorsNameTheirWireField) {
  const absl::Status s = WireFieldError("stream_options", "must be an object");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvalidField(s), "stream_options");
  EXPECT_EQ(InvalidField(absl::InvalidArgumentError("x")), "");
  EXPECT_EQ(InvalidField(WithWireField(absl::NotFoundError("x"), "model")), "model");
  EXPECT_TRUE(WithWireField(absl::OkStatus(), "model").ok());
}

TEST(WireFieldTest, ARuleRefusalGetsTheFrontEndsNameFirst) {
  const absl::Status rule = FieldError(RequestField::kNumSamples, "is 0: ask for at least 1");
  const absl::Status named = NameRequestField(rule, Names);
  EXPECT_EQ(named.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(named.message(), "n is 0: ask for at least 1");
  EXPECT_EQ(InvalidField(named), "n");
  // Named once: the result carries no request field any more.
  EXPECT_EQ(ErrorField(named), RequestField::kNone);
  EXPECT_EQ(NameRequestField(named, Names), named);
  // Other codes keep theirs.
  const absl::Status missing = NameRequestField(
      WithField(absl::NotFoundError("`x` is not loaded"), RequestField::kAdapter), Names);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "other `x` is not loaded");
}

TEST(WireFieldTest, OtherStatusesPassUnchanged) {
  const absl::Status full = absl::ResourceExhaustedError("request queue is full");
  EXPECT_EQ(NameRequestField(full, Names), full);
  const absl::Status parse = WireFieldError("prompt", "`prompt` is required");
  EXPECT_EQ(NameRequestField(parse, Names), parse);
  EXPECT_TRUE(NameRequestField(absl::OkStatus(), Names).ok());
}

}  // namespace
}  // namespace prefixd
