#include "client/commands.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

nlohmann::json AdaptersJson(const v1::ModelInfo& info) {
  nlohmann::json out = nlohmann::json::array();
  for (const v1::AdapterInfo& a : info.adapters()) {
    out.push_back({{"name", a.name()},
                   {"adapter_sha256", a.adapter_sha256()},
                   {"rank", a.rank()},
                   {"lora_alpha", a.lora_alpha()},
                   {"parent", a.parent()}});
  }
  return out;
}

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    default:
      return "unspecified";
  }
}

struct SampleOut {
  std::vector<uint32_t> token_ids;
  std::string text;
  std::vector<float> logprobs;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

// The prompt-logprobs message: each prompt id, and from the second on its logprob and top
// entries (GenerateResponse.prompt_*).
struct PromptScores {
  std::vector<uint32_t> token_ids;
  std::vector<float> logprobs;                                  // token_ids.size() - 1
  std::vector<std::vector<std::pair<uint32_t, float>>> top;     // the same
};

PromptScores PromptScoresOf(const v1::GenerateResponse& msg) {
  PromptScores p;
  p.token_ids.assign(msg.prompt_token_ids().begin(), msg.prompt_token_ids().end());
  p.logprobs.assign(msg.prompt_logprobs().begin(), msg.prompt_logprobs().end());
  for (const v1::TopLogprobs& t : msg.prompt_top_logprobs()) {
    std::vector<std::pair<uint32_t, float>> entries;
    for (int i = 0; i < t.token_ids_size() && i < t.logprobs_size(); ++i) {
      entries.emplace_back(t.token_ids(i), t.logprobs(i));
    }
    p.top.push_back(std::move(entries));
  }
  return p;
}

// {"token_ids": [...], "logprobs": [null, ...], "top_logprobs": [null, [{"id", "logprob"}]]}:
// one entry per prompt token, the first null (nothing comes before it).
nlohmann::json PromptScoresJson(const PromptScores& p) {
  nlohmann::json logprobs = nlohmann::json::array({nullptr});
  nlohmann::json top = nlohmann::json::array({nullptr});
  for (size_t i = 0; i < p.logprobs.size(); ++i) {
    logprobs.push_back(p.logprobs[i]);
    nlohmann::json entries = nlohmann::json::array();
    if (i < p.top.size()) {
      for (const auto& [id, lp] : p.top[i]) entries.push_back({{"id", id}, {"logprob", lp}});
    }
    top.push_back(std::move(entries));
  }
  return {{"token_ids", p.token_ids}, {"logprobs", logprobs}, {"top_logprobs", top}};
}

// One line per prompt token: position, id, logprob ("-" for the first) and the top entries.
void PrintPromptScores(const PromptScores& p, std::ostream& out) {
  double sum = 0;
  out << "--- prompt logprobs (position, token id, logprob, top id:logprob)\n";
  for (size_t i = 0; i < p.token_ids.size(); ++i) {
    out << absl::StrFormat("%5d %6u", i, p.token_ids[i]);
    if (i == 0 || i - 1 >= p.logprobs.size()) {
      out << "          -\n";
      continue;
    }
    const float lp = p.logprobs[i - 1];
    sum += lp;
    out << absl::StrFormat(" %10.5f", lp);
    if (i - 1 < p.top.size()) {
      for (const auto& [id, tlp] : p.top[i - 1]) out << absl::StrFormat(" %u:%.5f", id, tlp);
    }
    out << "\n";
  }
  out << absl::StrFormat("--- sum of %d prompt logprobs: %.5f\n", p.logprobs.size(), sum);
}

}  // namespace

int RunGenerate(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err) {
  const GenerateArgs& g = args.generate;
  v1::GenerateRequest req;
  if (g.text.has_value()) {
    req.set_text(*g.text);
  } else {
    for (uint32_t id : *g.ids) req.mutable_token_ids()->add_ids(id);
  }
  req.set_max_new_tokens(g.max_tokens);
  req.set_temperature(g.temperature);
  req.set_top_k(g.top_k);
  if (g.top_p.has_value()) req.set_top_p(*g.top_p);
  if (g.seed.has_value()) req.set_seed(*g.seed);
  req.set_num_samples(g.samples);
  req.set_cache_salt(g.salt);
  req.set_adapter(g.adapter);
  req.set_top_logprobs(g.top_logprobs);
  req.set_presence_penalty(g.presence_penalty);
  req.set_frequency_penalty(g.frequency_penalty);
  if (g.repetition_penalty.has_value()) req.set_repetition_penalty(*g.repetition_penalty);
  req.set_min_p(g.min_p);
  // A repeated id keeps its last bias, as in a JSON object.
  for (const auto& [id, bias] : g.logit_bias) (*req.mutable_logit_bias())[id] = bias;
  if (g.prompt_logprobs.has_value()) req.set_prompt_logprobs(*g.prompt_logprobs);

  auto ctx = conn.NewContext();
  auto reader = conn.stub().Generate(ctx.get(), req);
  std::map<uint32_t, SampleOut> samples;
  v1::Usage usage;
  const bool stream_text = !args.json && g.samples == 1;
  std::optional<PromptScores> prompt;
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.prompt_token_ids_size() > 0) {
      // The prompt-logprobs message: first in the stream, before any generated token.
      prompt = PromptScoresOf(msg);
      if (stream_text) PrintPromptScores(*prompt, out);
      continue;
    }
    SampleOut& s = samples[msg.sample_index()];
    s.token_ids.insert(s.token_ids.end(), msg.token_ids().begin(), msg.token_ids().end());
    s.logprobs.insert(s.logprobs.end(), msg.logprobs().begin(), msg.logprobs().end());
    s.text += msg.text();
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) s.finish = msg.finish_reason();
    if (msg.has_usage()) usage = msg.usage();
    if (stream_text && !msg.text().empty()) out << msg.text() << std::flush;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    if (stream_text) out << "\n";
    err << DescribeRpcError("generate", status) << "\n";
    return 1;
  }
  if (args.json) {
    nlohmann::json j;
    j["samples"] = nlohmann::json::array();
    for (const auto& [index, s] : samples) {
      j["samples"].push_back({{"index", index},
                              {"token_ids", s.token_ids},
                              {"text", s.text},
                              {"logprobs", s.logprobs},
                              {"finish_reason", FinishName(s.finish)}});
    }
    if (prompt.has_value()) j["prompt"] = PromptScoresJson(*prompt);
    j["usage"] = {{"prompt_tokens", usage.prompt_tokens()},
                  {"cached_prompt_tokens", usage.cached_prompt_tokens()},
                  {"completion_tokens", usage.completion_tokens()}};
    out << j.dump() << "\n";
    return 0;
  }
  if (!stream_text) {
    if (prompt.has_value()) PrintPromptScores(*prompt, out);
    for (const auto& [index, s] : samples) {
      out << "--- sample " << index << " (" << FinishName(s.finish) << ")\n" << s.text << "\n";
    }
  } else {
    out << "\n";
  }
  out << absl::StrFormat("[prompt_tokens=%u cached_prompt_tokens=%u completion_tokens=%u]\n",
                         usage.prompt_tokens(), usage.cached_prompt_tokens(),
                         usage.completion_tokens());
  return 0;
}

int RunTokenize(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err) {
  v1::TokenizeRequest req;
  req.set_text(args.tokenize_text);
  req.set_adapter(args.tokenize_adapter);
  v1::TokenizeResponse resp;
  auto ctx = conn.NewContext();
  grpc::Status status = conn.stub().Tokenize(ctx.get(), req, &resp);
  if (!status.ok()) {
    err << DescribeRpcError("tokenize", status) << "\n";
    return 1;
  }
  std::vector<uint32_t> ids(resp.token_ids().begin(), resp.token_ids().end());
  if (args.json) {
    out << nlohmann::json({{"token_ids", ids}}).dump() << "\n";
  } else {
    out << absl::StrJoin(ids, ",") << "\n";
  }
  return 0;
}

int RunInfo(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err) {
  v1::ModelInfo info;
  auto ctx = conn.NewContext();
  grpc::Status status = conn.stub().GetModelInfo(ctx.get(), v1::GetModelInfoRequest(), &info);
  if (!status.ok()) {
    err << DescribeRpcError("info", status) << "\n";
    return 1;
  }
  if (args.json) {
    out << nlohmann::json({{"model_name", info.model_name()},
                           {"manifest_sha256", info.manifest_sha256()},
                           {"n_layer", info.n_layer()},
                           {"n_head", info.n_head()},
                           {"n_embd", info.n_embd()},
                           {"vocab_size", info.vocab_size()},
                           {"context_length", info.context_length()},
                           {"dtype", info.dtype()},
                           {"device", info.device()},
                           {"block_size", info.block_size()},
                           {"kv_pool_blocks", info.kv_pool_blocks()},
                           {"kv_bytes_per_token", info.kv_bytes_per_token()},
                           {"adapters", AdaptersJson(info)},
                           {"max_adapters", info.max_adapters()}})
               .dump()
        << "\n";
    return 0;
  }
  out << absl::StrFormat(
      "model            %s\n"
      "manifest sha256  %s\n"
      "layers/heads/embd %u / %u / %u\n"
      "vocab            %u\n"
      "context          %u tokens\n"
      "device / dtype   %s / %s\n"
      "KV pool          %u blocks x %u tokens (%u tokens), %u bytes per token\n",
      info.model_name(), info.manifest_sha256(), info.n_layer(), info.n_head(), info.n_embd(),
      info.vocab_size(), info.context_length(), info.device(), info.dtype(), info.kv_pool_blocks(),
      info.block_size(), info.kv_pool_blocks() * info.block_size(), info.kv_bytes_per_token());
  for (const v1::AdapterInfo& a : info.adapters()) {
    out << absl::StrFormat("adapter          %s: rank %u, alpha %g, sha256 %s\n", a.name(),
                           a.rank(), a.lora_alpha(), a.adapter_sha256());
  }
  return 0;
}

void PrintCacheStats(const v1::CacheStats& s, bool json, std::ostream& out) {
  if (json) {
    out << nlohmann::json({{"queried_tokens", s.queried_tokens()},
                           {"hit_tokens", s.hit_tokens()},
                           {"blocks_total", s.blocks_total()},
                           {"blocks_free", s.blocks_free()},
                           {"blocks_active", s.blocks_active()},
                           {"blocks_cached", s.blocks_cached()},
                           {"evictions", s.evictions()},
                           {"cow_copies", s.cow_copies()},
                           {"cow_rows", s.cow_rows()},
                           {"pool_bytes", s.pool_bytes()},
                           {"disk_hit_tokens", s.disk_hit_tokens()},
                           {"disk_blocks", s.disk_blocks()},
                           {"disk_bytes", s.disk_bytes()},
                           {"disk_cap_bytes", s.disk_cap_bytes()},
                           {"disk_spills", s.disk_spills()},
                           {"disk_spills_dropped", s.disk_spills_dropped()},
                           {"disk_loads", s.disk_loads()},
                           {"disk_corrupt_blocks", s.disk_corrupt_blocks()},
                           {"remote_configured", s.remote_configured()},
                           {"remote_up", s.remote_up()},
                           {"remote_hit_tokens", s.remote_hit_tokens()},
                           {"remote_stores", s.remote_stores()},
                           {"remote_stores_dropped", s.remote_stores_dropped()},
                           {"remote_loads", s.remote_loads()},
                           {"remote_corrupt_blocks", s.remote_corrupt_blocks()},
                           {"remote_errors", s.remote_errors()}})
               .dump()
        << "\n";
    return;
  }
  const double ratio = s.queried_tokens() == 0 ? 0.0
                                               : 100.0 * static_cast<double>(s.hit_tokens()) /
                                                     static_cast<double>(s.queried_tokens());
  out << absl::StrFormat(
      "prefix cache     %u of %u prompt tokens served from cache (%.1f%%)\n"
      "KV blocks        %u total: %u free, %u active, %u cached\n"
      "evictions        %u\n"
      "copy-on-write    %u block copies\n"
      "pool             %u bytes\n",
      s.hit_tokens(), s.queried_tokens(), ratio, s.blocks_total(), s.blocks_free(),
      s.blocks_active(), s.blocks_cached(), s.evictions(), s.cow_copies(), s.pool_bytes());
  if (s.disk_cap_bytes() > 0) {
    out << absl::StrFormat(
        "disk tier        %u blocks, %u of %u bytes; %u of the prompt tokens above came from it\n"
        "disk traffic     %u blocks written, %u dropped, %u read back, %u corrupt (recomputed)\n",
        s.disk_blocks(), s.disk_bytes(), s.disk_cap_bytes(), s.disk_hit_tokens(), s.disk_spills(),
        s.disk_spills_dropped(), s.disk_loads(), s.disk_corrupt_blocks());
  }
  if (s.remote_configured()) {
    out << absl::StrFormat(
        "remote tier      %s; %u of the prompt tokens above came from it\n"
        "remote traffic   %u blocks published, %u dropped, %u read, %u corrupt (recomputed), "
        "%u faults\n",
        s.remote_up() ? "up" : "DOWN", s.remote_hit_tokens(), s.remote_stores(),
        s.remote_stores_dropped(), s.remote_loads(), s.remote_corrupt_blocks(), s.remote_errors());
  }
}

int RunStats(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err) {
  v1::CacheStats s;
  auto ctx = conn.NewContext();
  grpc::Status status = conn.stub().GetCacheStats(ctx.get(), v1::GetCacheStatsRequest(), &s);
  if (!status.ok()) {
    err << DescribeRpcError("stats", status) << "\n";
    return 1;
  }
  PrintCacheStats(s, args.json, out);
  return 0;
}

int RunHealth(Connection& conn, std::ostream& out, std::ostream& err) {
  auto stub = grpc::health::v1::Health::NewStub(conn.channel());
  grpc::health::v1::HealthCheckRequest req;  // service "": the server as a whole
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = conn.NewContext();
  const grpc::Status status = stub->Check(ctx.get(), req, &resp);
  if (!status.ok()) {
    err << DescribeRpcError("health check", status) << "\n";
    return 1;
  }
  out << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace prefixd
