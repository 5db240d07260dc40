#include "server/inference_service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/generate_reactor.h"
#include "server/grpc_status.h"

namespace prefixd {

InferenceService::InferenceService(InferenceServiceOptions options)
    : options_(std::move(options)) {}

std::string InferenceService::NextRequestId() {
  return absl::StrCat("prefixd-", next_request_id_.fetch_add(1));
}

void InferenceService::GenerateStarted() {
  absl::MutexLock l(&calls_mu_);
  ++live_generates_;
}

void InferenceService::GenerateDone() {
  absl::MutexLock l(&calls_mu_);
  --live_generates_;
}

bool InferenceService::WaitForNoGenerates(absl::Duration timeout) {
  absl::MutexLock l(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return live_generates_ == 0; };
  return calls_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

absl::StatusOr<std::string> InferenceService::Admit(grpc::CallbackServerContext* context) const {
  if (draining_.load()) return absl::UnavailableError("prefixd is shutting down");
  std::optional<std::string_view> authorization;
  const auto& md = context->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    authorization = std::string_view(it->second.data(), it->second.size());
  }
  return options_.auth->Authenticate(authorization);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return GenerateReactor::Start(this, context, request);
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> tenant = Admit(context);
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  for (uint32_t id : options_.tokenizer->Encode(request->text())) response->add_token_ids(id);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetModelInfoRequest*,
                                                         v1::ModelInfo* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> tenant = Admit(context);
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  *response = options_.model_info;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::GetCacheStats(grpc::CallbackServerContext* context,
                                                          const v1::GetCacheStatsRequest*,
                                                          v1::CacheStats* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> tenant = Admit(context);
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  const EngineStats s = options_.engine->Stats();
  response->set_queried_tokens(s.queried_tokens);
  response->set_hit_tokens(s.hit_tokens);
  response->set_blocks_total(s.blocks_total);
  response->set_blocks_free(s.blocks_free);
  response->set_blocks_active(s.blocks_active);
  response->set_blocks_cached(s.blocks_cached);
  response->set_evictions(s.evictions);
  response->set_cow_copies(s.cow_copies);
  response->set_pool_bytes(s.pool_bytes);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace prefixd
