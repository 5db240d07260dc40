#include "engine/score_store.h"

namespace prefixd {

std::vector<PositionScore> ToPositionScores(const BlockScores& scores) {
  std::vector<PositionScore> out;
  out.reserve(scores.positions.size());
  for (const PromptToken& p : scores.positions) {
    PositionScore s;
    s.has_logprob = p.has_logprob;
    s.logprob = p.logprob;
    s.top.reserve(p.top.size());
    for (const TokenLogprob& t : p.top) s.top.push_back({t.token_id, t.logprob});
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<BlockScores> FromPositionScores(absl::Span<const uint32_t> tokens,
                                              const std::vector<PositionScore>& section,
                                              uint32_t vocab_size) {
  if (section.size() != tokens.size()) return std::nullopt;
  BlockScores out;
  out.positions.reserve(section.size());
  for (size_t j = 0; j < section.size(); ++j) {
    const PositionScore& s = section[j];
    PromptToken p{
        .token_id = tokens[j], .has_logprob = s.has_logprob, .logprob = s.logprob, .top = {}};
    p.top.reserve(s.top.size());
    for (const PositionScore::Entry& e : s.top) {
      if (e.id >= vocab_size) return std::nullopt;
      p.top.push_back({.token_id = e.id, .logprob = e.logprob});
    }
    out.positions.push_back(std::move(p));
  }
  return out;
}

}  // namespace prefixd
