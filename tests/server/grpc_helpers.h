// Client-side helpers for the integration tests: channels, a Generate call collected into
// one result, and cache statistics.
#ifndef PREFIXD_TESTS_SERVER_GRPC_HELPERS_H_
#define PREFIXD_TESTS_SERVER_GRPC_HELPERS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"

namespace prefixd::testing {

std::shared_ptr<grpc::Channel> InsecureChannel(const std::string& address);

struct SampleResult {
  std::vector<uint32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<v1::TopLogprobs> top;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  int finish_messages = 0;  // messages that carried a finish_reason
};

struct GenerateResult {
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;
  std::map<uint32_t, SampleResult> samples;
  v1::Usage usage;
  int usage_messages = 0;
};

// Runs one Generate call to its end. `token` adds "authorization: Bearer <token>".
GenerateResult Generate(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                        const std::string& token = "");

// Token-id prompt helper.
v1::GenerateRequest IdsRequest(const std::vector<uint32_t>& ids, uint32_t max_new_tokens);

// `n` deterministic pseudo-random ids below 50000, different for each `seed`.
std::vector<uint32_t> RandomIds(uint32_t seed, size_t n);

// The sum of the samples of a text exposition that have the name of `series` and every label
// it gives (others, like `adapter`, are summed over): "prefixd_requests_total{code=\"OK\"}"
// is every OK request, whatever its api and adapter. -1 if none matches.
double MetricValue(const std::string& exposition, const std::string& series);

v1::CacheStats GetStats(v1::Inference::Stub& stub, const std::string& token = "");

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_SERVER_GRPC_HELPERS_H_
