#include "tests/server/grpc_helpers.h"

#include <map>
#include <random>
#include <sstream>
#include <string_view>

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

namespace {

// "name{k=\"v\",...}" into the name and its labels; false when malformed.
bool ParseSeries(std::string_view text, std::string* name,
                 std::map<std::string, std::string>* labels, size_t* end) {
  const size_t brace = text.find_first_of("{ ");
  *name = std::string(text.substr(0, brace));
  labels->clear();
  if (brace == std::string_view::npos || text[brace] == ' ') {
    *end = brace == std::string_view::npos ? text.size() : brace;
    return !name->empty();
  }
  size_t i = brace + 1;
  while (i < text.size() && text[i] != '}') {
    const size_t eq = text.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= text.size() || text[eq + 1] != '"') return false;
    std::string key(text.substr(i, eq - i));
    std::string value;
    size_t j = eq + 2;
    for (; j < text.size() && text[j] != '"'; ++j) {
      if (text[j] == '\\' && j + 1 < text.size()) ++j;
      value += text[j];
    }
    if (j >= text.size()) return false;
    (*labels)[std::move(key)] = std::move(value);
    i = j + 1;
    if (i < text.size() && text[i] == ',') ++i;
  }
  if (i >= text.size()) return false;
  *end = i + 1;
  return true;
}

}  // namespace

double MetricValue(const std::string& exposition, const std::string& series) {
  std::string want_name;
  std::map<std::string, std::string> want;
  size_t end = 0;
  if (!ParseSeries(series, &want_name, &want, &end)) return -1;
  double sum = -1;
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::string name;
    std::map<std::string, std::string> labels;
    if (!ParseSeries(line, &name, &labels, &end) || name != want_name) continue;
    bool match = true;
    for (const auto& [key, value] : want) {
      auto it = labels.find(key);
      match = match && it != labels.end() && it->second == value;
    }
    if (!match) continue;
    sum = (sum < 0 ? 0 : sum) + std::stod(line.substr(end));
  }
  return sum;
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
