// prefixd-model generate DIR (--ids 1,2,3 | --text "...") --max-tokens N [--top-logprobs K]
//   [--threads T] [--device auto|cpu|cuda] [--ignore-eos] [--json]
//
// Offline greedy decoding through a backend's KV cache, without the server or the engine's
// scheduler: one sequence, one block table covering prompt + max tokens. With --json it is an
// oracle for tests of the server: one object with the prompt ids, the generated ids, and per
// generated token its log-probability and the top-K (log-softmax of the raw logits).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_layout.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace prefixd::tools {
namespace {

constexpr int32_t kBlockSize = 16;

struct GenerateFlags {
  std::string dir;
  std::vector<uint32_t> ids;  // set from --ids, or later from --text
  std::optional<std::string> text;
  int64_t max_tokens = 0;
  int64_t top_logprobs = 0;
  int64_t threads = 0;
  std::string device = "auto";
  bool ignore_eos = false;
  bool json = false;
};

constexpr char kUsage[] =
    "usage: prefixd-model generate DIR (--ids 1,2,3 | --text TEXT) --max-tokens N "
    "[--top-logprobs K] [--threads T] [--device auto|cpu|cuda] [--ignore-eos] [--json]";

absl::StatusOr<GenerateFlags> ParseGenerateFlags(absl::Span<char* const> args) {
  static constexpr FlagSpec kFlags[] = {{"ids"},
                                        {"text"},
                                        {"max-tokens"},
                                        {"top-logprobs"},
                                        {"threads"},
                                        {"device"},
                                        {"ignore-eos", FlagKind::kSwitch},
                                        {"json", FlagKind::kSwitch}};
  absl::StatusOr<ParsedCommandLine> parsed = ParseArgv(args, kFlags);
  if (!parsed.ok()) return parsed.status();
  GenerateFlags f;
  f.ignore_eos = parsed->Has("ignore-eos");
  f.json = parsed->Has("json");
  if (parsed->positional.size() != 1) return absl::InvalidArgumentError(kUsage);
  f.dir = parsed->positional[0];
  const std::optional<std::string> ids = parsed->Flag("ids");
  f.text = parsed->Flag("text");
  if (ids.has_value() == f.text.has_value()) {
    return absl::InvalidArgumentError("generate: give exactly one of --ids and --text");
  }
  if (ids) {
    absl::StatusOr<std::vector<uint32_t>> parsed_ids = ParseIdList(*ids, "--ids entry");
    if (!parsed_ids.ok()) return parsed_ids.status();
    f.ids = *std::move(parsed_ids);
  }
  const std::optional<std::string> max_tokens = parsed->Flag("max-tokens");
  if (!max_tokens) return absl::InvalidArgumentError("generate: --max-tokens is required");
  absl::StatusOr<int64_t> n = ParseInteger(*max_tokens, "--max-tokens", 1, 1 << 20);
  if (!n.ok()) return n.status();
  f.max_tokens = *n;
  if (auto k = parsed->Flag("top-logprobs")) {
    absl::StatusOr<int64_t> v = ParseInteger(*k, "--top-logprobs", 0, 1 << 20);
    if (!v.ok()) return v.status();
    f.top_logprobs = *v;
  }
  if (auto t = parsed->Flag("threads")) {
    absl::StatusOr<int64_t> v = ParseInteger(*t, "--threads", 0, 1024);
    if (!v.ok()) return v.status();
    f.threads = *v;
  }
  if (auto d = parsed->Flag("device")) f.device = *d;
  if (f.device != "auto" && f.device != "cpu" && f.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("generate: --device must be auto, cpu or cuda, not \"", f.device, "\""));
  }
  return f;
}

struct TokenResult {
  uint32_t id = 0;
  double logprob = 0;
  std::vector<uint32_t> top_ids;
  std::vector<double> top_logprobs;
};

// Greedy choice (highest logit, ties to the lower id) with log-softmax in double.
TokenResult Choose(const float* logits, int64_t vocab, int64_t top_k) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  double sum = 0;
  const double max = logits[best];
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double{logits[i]} - max);
  const double lse = max + std::log(sum);
  TokenResult r;
  r.id = static_cast<uint32_t>(best);
  r.logprob = double{logits[best]} - lse;
  top_k = std::min(top_k, vocab);
  std::vector<uint32_t> order(vocab);
  for (int64_t i = 0; i < vocab; ++i) order[i] = static_cast<uint32_t>(i);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](uint32_t a, uint32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int64_t i = 0; i < top_k; ++i) {
    r.top_ids.push_back(order[i]);
    r.top_logprobs.push_back(double{logits[order[i]]} - lse);
  }
  return r;
}

absl::Status Generate(GenerateFlags& f) {
  if (f.device == "cuda") {
    return absl::UnimplementedError(
        "generate: --device cuda is not available in prefixd-model yet; use --device cpu");
  }
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(f.dir);
  if (!model.ok()) return model.status();
  const ModelConfig& c = (*model)->config();
  if (f.text) f.ids = (*model)->tokenizer().Encode(*f.text);
  if (f.ids.empty()) return absl::InvalidArgumentError("generate: the prompt has no tokens");
  for (uint32_t id : f.ids) {
    if (id >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("generate: token id ", id, " >= vocab size ", c.vocab_size));
    }
  }
  const int64_t total = static_cast<int64_t>(f.ids.size()) + f.max_tokens;
  // The last generated token is never fed back, so the context needs total - 1 positions.
  if (total - 1 > c.n_positions) {
    return absl::InvalidArgumentError(
        absl::StrCat("generate: prompt (", f.ids.size(), " tokens) + --max-tokens ", f.max_tokens,
                     " exceeds the model's context of ", c.n_positions, " tokens"));
  }
  const int64_t blocks = (total + kBlockSize - 1) / kBlockSize;
  CpuBackendOptions o;
  o.model = model->get();
  o.kv_pool.block_size = kBlockSize;
  o.threads = static_cast<int32_t>(f.threads);
  o.kv_pool.budget_bytes = blocks * kBlockSize * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(o);
  if (!backend.ok()) return backend.status();
  std::vector<int32_t> table(blocks);
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);

  std::vector<uint32_t> tokens = f.ids;
  std::vector<TokenResult> generated;
  std::vector<float> logits;
  SequenceStep step{tokens, 0, table, true};
  while (true) {
    logits.clear();
    if (absl::Status s = (*backend)->Forward({step}, &logits); !s.ok()) return s;
    generated.push_back(Choose(logits.data(), c.vocab_size, f.top_logprobs));
    const uint32_t next = generated.back().id;
    if (static_cast<int64_t>(generated.size()) == f.max_tokens) break;
    if (next == c.eos_token_id && !f.ignore_eos) break;
    tokens.push_back(next);
    step = SequenceStep{absl::MakeConstSpan(tokens).subspan(tokens.size() - 1),
                        static_cast<int32_t>(tokens.size()) - 1, table, true};
  }

  if (f.json) {
    nlohmann::json out;
    out["prompt_ids"] = f.ids;
    out["generated_ids"] = nlohmann::json::array();
    out["logprobs"] = nlohmann::json::array();
    out["top_logprobs"] = nlohmann::json::array();
    for (const TokenResult& t : generated) {
      out["generated_ids"].push_back(t.id);
      out["logprobs"].push_back(t.logprob);
      out["top_logprobs"].push_back({{"token_ids", t.top_ids}, {"logprobs", t.top_logprobs}});
    }
    std::printf("%s\n", out.dump().c_str());
    return absl::OkStatus();
  }
  std::vector<uint32_t> ids;
  for (const TokenResult& t : generated) ids.push_back(t.id);
  absl::StatusOr<std::string> text = (*model)->tokenizer().Decode(ids);
  if (text.ok()) {
    std::printf("%s\n", text->c_str());
  } else {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerateCommand(absl::Span<char* const> args) {
  absl::StatusOr<GenerateFlags> flags = ParseGenerateFlags(args);
  if (!flags.ok()) return ReportError(flags.status(), kExitUsage);
  const absl::Status status = Generate(*flags);
  return status.ok() ? 0 : ReportError(status);
}

}  // namespace prefixd::tools
