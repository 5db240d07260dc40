#include "server/inference_service.h"

#include <algorithm>
#include <utility>

#include "engine/engine_stats.h"
#include "server/generate_reactor.h"
#include "server/grpc_status.h"
#include "server/wire_field.h"

namespace prefixd {

std::optional<std::string> AuthorizationOf(const grpc::CallbackServerContext& context) {
  const auto& md = context.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    return std::string(it->second.data(), it->second.size());
  }
  return std::nullopt;
}

GenerateCall ToGenerateCall(const v1::GenerateRequest& request) {
  GenerateCall call;
  EngineRequest& r = call.request;
  r.request_id = request.request_id();
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      call.text = request.text();
      break;
    case v1::GenerateRequest::kTokenIds:
      r.prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET:  // an empty prompt, refused by its rule
      break;
  }
  call.cache_salt = request.cache_salt();
  call.cache_retention = request.prompt_cache_retention();
  call.prompt_cache_key = request.prompt_cache_key();
  call.adapter = request.adapter();
  call.stop.assign(request.stop().begin(), request.stop().end());
  r.max_new_tokens = request.max_new_tokens();
  r.sampling.temperature = request.temperature();
  r.sampling.top_k = request.top_k();
  if (request.has_top_p()) r.sampling.top_p = request.top_p();
  r.sampling.seed = request.has_seed() ? request.seed() : RandomSeed();
  r.sampling.presence_penalty = request.presence_penalty();
  r.sampling.frequency_penalty = request.frequency_penalty();
  if (request.has_repetition_penalty()) {
    r.sampling.repetition_penalty = request.repetition_penalty();
  }
  r.sampling.min_p = request.min_p();
  // A proto map has no order: sorted by id, so a request means one thing.
  for (const auto& [id, bias] : request.logit_bias()) r.sampling.logit_bias.push_back({id, bias});
  std::sort(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end(),
            [](const TokenBias& a, const TokenBias& b) { return a.token_id < b.token_id; });
  r.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  r.ignore_eos = request.ignore_eos();
  // proto3 cannot tell 0 from unset: 0 is the default, one sample.
  r.num_samples = request.num_samples() == 0 ? 1 : request.num_samples();
  r.top_logprobs = request.top_logprobs();
  if (request.has_prompt_logprobs()) r.prompt_logprobs = request.prompt_logprobs();
  return call;
}

std::string_view GrpcFieldName(RequestField field, const v1::GenerateRequest& request) {
  switch (field) {
    case RequestField::kNone:
      break;
    case RequestField::kRequestId:
      return "request_id";
    case RequestField::kPrompt:
      return request.has_token_ids() ? "token_ids" : "text";
    case RequestField::kMaxNewTokens:
      return "max_new_tokens";
    case RequestField::kTemperature:
      return "temperature";
    case RequestField::kTopK:
      return "top_k";
    case RequestField::kTopP:
      return "top_p";
    case RequestField::kSeed:
      return "seed";
    case RequestField::kPresencePenalty:
      return "presence_penalty";
    case RequestField::kFrequencyPenalty:
      return "frequency_penalty";
    case RequestField::kRepetitionPenalty:
      return "repetition_penalty";
    case RequestField::kMinP:
      return "min_p";
    case RequestField::kLogitBias:
      return "logit_bias";
    case RequestField::kStopTokenIds:
      return "stop_token_ids";
    case RequestField::kIgnoreEos:
      return "ignore_eos";
    case RequestField::kNumSamples:
      return "num_samples";
    case RequestField::kTopLogprobs:
      return "top_logprobs";
    case RequestField::kEchoPrompt:  // no field of its own: prompt_logprobs echoes the prompt
    case RequestField::kPromptLogprobs:
      return "prompt_logprobs";
    case RequestField::kAdapter:
      return "adapter";
    case RequestField::kStop:
      return "stop";
    case RequestField::kCacheSalt:
      return "cache_salt";
    case RequestField::kCacheRetention:
      return "prompt_cache_retention";
  }
  return "request";
}

void ToProto(const ServedModel& model, v1::ModelInfo* out) {
  out->set_model_name(model.name);
  out->set_manifest_sha256(model.manifest_sha256);
  out->set_n_layer(model.config.n_layer);
  out->set_n_head(model.config.n_head);
  out->set_n_embd(model.config.n_embd);
  out->set_vocab_size(model.config.vocab_size);
  out->set_context_length(model.config.n_positions);
  out->set_dtype(model.dtype);
  out->set_device(model.device);
  out->set_block_size(model.kv_pool.block_size);
  out->set_kv_pool_blocks(model.kv_pool.num_blocks);
  out->set_kv_bytes_per_token(model.kv_pool.bytes_per_token);
  for (const AdapterInfo& a : model.adapters) {
    v1::AdapterInfo* info = out->add_adapters();
    info->set_name(a.name);
    info->set_adapter_sha256(a.digest);
    info->set_rank(a.rank);
    info->set_lora_alpha(a.lora_alpha);
    info->set_parent(model.name);
  }
  out->set_max_adapters(model.max_adapters);
}

void ToProto(const EngineStats& stats, v1::CacheStats* out) {
  const KvCacheStats& c = stats.cache;
  out->set_queried_tokens(c.queried_tokens);
  out->set_hit_tokens(HitTokens(stats));
  out->set_blocks_total(c.blocks_total);
  out->set_blocks_free(c.blocks_free);
  out->set_blocks_active(c.blocks_active);
  out->set_blocks_cached(c.blocks_cached);
  out->set_evictions(c.evictions);
  out->set_cow_copies(c.cow_copies);
  out->set_pool_bytes(c.pool_bytes);
  out->set_cow_rows(c.cow_rows);
  const DiskTierStats& d = stats.disk;
  out->set_disk_hit_tokens(stats.scheduler.disk_hit_tokens);
  out->set_disk_blocks(static_cast<uint64_t>(d.blocks));
  out->set_disk_bytes(static_cast<uint64_t>(d.bytes));
  out->set_disk_cap_bytes(static_cast<uint64_t>(d.cap_bytes));
  out->set_disk_spills(d.spills);
  out->set_disk_spills_dropped(d.spills_dropped);
  out->set_disk_loads(d.loads);
  out->set_disk_corrupt_blocks(d.corrupt_blocks);
  const RemoteTierStats& rt = stats.remote;
  out->set_remote_configured(rt.configured);
  out->set_remote_up(rt.up);
  out->set_remote_hit_tokens(stats.scheduler.remote_hit_tokens);
  out->set_remote_stores(rt.stores);
  out->set_remote_stores_dropped(rt.stores_dropped);
  out->set_remote_loads(rt.loads);
  out->set_remote_corrupt_blocks(rt.corrupt_blocks);
  out->set_remote_errors(rt.connect_errors + rt.match_errors + rt.load_errors + rt.store_errors);
}

void InferenceService::GenerateStarted() {
  absl::MutexLock l(&calls_mu_);
  ++live_generates_;
}

void InferenceService::GenerateDone() {
  absl::MutexLock l(&calls_mu_);
  --live_generates_;
}

int64_t InferenceService::live_generates() const {
  absl::MutexLock l(&calls_mu_);
  return live_generates_;
}

bool InferenceService::WaitForNoGenerates(absl::Duration timeout) {
  absl::MutexLock l(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return live_generates_ == 0; };
  return calls_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return GenerateReactor::Start(this, context, request);
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<std::vector<uint32_t>> ids =
      path_->Tokenize(AuthorizationOf(*context), request->text(), request->adapter());
  if (ids.ok()) {
    for (uint32_t id : *ids) response->add_token_ids(id);
  }
  // TokenizeRequest's fields: the prompt is its `text`.
  reactor->Finish(ToGrpcStatus(NameRequestField(ids.status(), [](RequestField f) {
    return f == RequestField::kAdapter ? std::string_view("adapter") : std::string_view("text");
  })));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetModelInfoRequest*,
                                                         v1::ModelInfo* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<ServedModel> model = path_->ModelInfo(AuthorizationOf(*context));
  if (model.ok()) ToProto(*model, response);
  reactor->Finish(ToGrpcStatus(model.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::GetCacheStats(grpc::CallbackServerContext* context,
                                                          const v1::GetCacheStatsRequest*,
                                                          v1::CacheStats* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<EngineStats> stats = path_->CacheStats(AuthorizationOf(*context));
  if (stats.ok()) ToProto(*stats, response);
  reactor->Finish(ToGrpcStatus(stats.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::LoadLoraAdapterRequest* request,
    v1::AdapterInfo* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<AdapterInfo> info =
      path_->LoadAdapter(AuthorizationOf(*context), request->lora_name(), request->lora_path());
  if (info.ok()) {
    response->set_name(info->name);
    response->set_adapter_sha256(info->digest);
    response->set_rank(info->rank);
    response->set_lora_alpha(info->lora_alpha);
    response->set_parent(path_->model().name);
  }
  reactor->Finish(ToGrpcStatus(info.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::UnloadLoraAdapterRequest* request,
    v1::UnloadLoraAdapterResponse*) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(path_->UnloadAdapter(AuthorizationOf(*context), request->lora_name())));
  return reactor;
}

}  // namespace prefixd
