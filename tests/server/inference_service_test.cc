// The gRPC front end's parser (server/inference_service.h): GenerateRequest into a
// GenerateCall with proto3's defaults read, and each request field's proto name.
#include "server/inference_service.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prefixd/v1/inference.pb.h"

namespace prefixd {
namespace {

// gRPC names each field as GenerateRequest does: every name is one of its fields, and the
// prompt's is the one the request set.
TEST(InferenceServiceTest, EveryRequestFieldHasAProtoName) {
  const google::protobuf::Descriptor* d = v1::GenerateRequest::descriptor();
  v1::GenerateRequest ids;
  ids.mutable_token_ids()->add_ids(1);
  for (int f = static_cast<int>(RequestField::kNone) + 1;
       f <= static_cast<int>(RequestField::kCacheSalt); ++f) {
    const std::string name(GrpcFieldName(static_cast<RequestField>(f), ids));
    EXPECT_NE(d->FindFieldByName(name), nullptr) << f << ": " << name;
  }
  EXPECT_EQ(GrpcFieldName(RequestField::kPrompt, ids), "token_ids");
  v1::GenerateRequest text;
  text.set_text("x");
  EXPECT_EQ(GrpcFieldName(RequestField::kPrompt, text), "text");
  EXPECT_EQ(GrpcFieldName(RequestField::kPrompt, v1::GenerateRequest()), "text");
  EXPECT_EQ(GrpcFieldName(RequestField::kMaxNewTokens, text), "max_new_tokens");
  EXPECT_EQ(GrpcFieldName(RequestField::kNumSamples, text), "num_samples");
}

// The gRPC parser reads proto3's unset values as inference.proto says, and checks nothing.
TEST(InferenceServiceTest, TheGrpcParserReadsProto3Defaults) {
  v1::GenerateRequest r;
  r.set_text("hello");
  r.set_max_new_tokens(0);
  GenerateCall call = ToGenerateCall(r);
  EXPECT_EQ(call.text, "hello");
  EXPECT_EQ(call.request.num_samples, 1u) << "0 is unset: one sample";
  EXPECT_EQ(call.request.max_new_tokens, 0u) << "refused by the engine's rule, not here";
  EXPECT_EQ(call.request.sampling.top_p, 1.0f);
  EXPECT_EQ(call.request.sampling.repetition_penalty, 1.0f);
  r.set_num_samples(3);
  r.set_seed(7);
  r.set_cache_salt("s");
  r.set_adapter("sql");
  r.add_stop("\n");
  call = ToGenerateCall(r);
  EXPECT_EQ(call.request.num_samples, 3u);
  EXPECT_EQ(call.request.sampling.seed, 7u);
  EXPECT_EQ(call.cache_salt, "s");
  EXPECT_EQ(call.adapter, "sql");
  EXPECT_EQ(call.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(call.request.cache_namespace.empty()) << "the request path derives it";
  EXPECT_FALSE(ToGenerateCall(v1::GenerateRequest()).text.has_value());
}

}  // namespace
}  // namespace prefixd
