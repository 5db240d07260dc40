#include "tests/server/grpc_helpers.h"

#include <random>

#include "gtest/gtest.h"

namespace prefixd::testing {

std::shared_ptr<grpc::Channel> InsecureChannel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

GenerateResult Generate(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                        const std::string& token) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  GenerateResult r;
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    r.messages.push_back(msg);
    SampleResult& s = r.samples[msg.sample_index()];
    s.token_ids.insert(s.token_ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    s.logprobs.insert(s.logprobs.end(), msg.logprobs().begin(), msg.logprobs().end());
    s.top.insert(s.top.end(), msg.top_logprobs().begin(), msg.top_logprobs().end());
    s.text += msg.text();
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      s.finish = msg.finish_reason();
      ++s.finish_messages;
    }
    if (msg.has_usage()) {
      r.usage = msg.usage();
      ++r.usage_messages;
    }
  }
  r.status = reader->Finish();
  // A usage-only final message belongs to no sample.
  for (auto it = r.samples.begin(); it != r.samples.end();) {
    if (it->second.token_ids.empty() && it->second.finish_messages == 0) {
      it = r.samples.erase(it);
    } else {
      ++it;
    }
  }
  return r;
}

v1::GenerateRequest IdsRequest(const std::vector<uint32_t>& ids, uint32_t max_new_tokens) {
  v1::GenerateRequest r;
  for (uint32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_new_tokens(max_new_tokens);
  r.set_ignore_eos(true);
  return r;
}

std::vector<uint32_t> RandomIds(uint32_t seed, size_t n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> dist(0, 49999);
  std::vector<uint32_t> ids(n);
  for (uint32_t& id : ids) id = dist(rng);
  return ids;
}

double MetricValue(const std::string& exposition, const std::string& series) {
  const std::string needle = series + " ";
  for (size_t pos = 0; (pos = exposition.find(needle, pos)) != std::string::npos;
       pos += needle.size()) {
    if (pos == 0 || exposition[pos - 1] == '\n') {
      return std::stod(exposition.substr(pos + needle.size()));
    }
  }
  return -1;
}

v1::CacheStats GetStats(v1::Inference::Stub& stub, const std::string& token) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::CacheStats stats;
  grpc::Status s = stub.GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return stats;
}

}  // namespace prefixd::testing
