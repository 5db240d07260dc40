// The StepOutput stage on a real tiny KvCache and fake logits rows: the sampled token, its
// events and append, the end of a sample (EOS, a stop id, max_new_tokens), the fork of a
// prompt with several samples, the prompt event (ids, or the scorer's logprobs), and ending
// requests. Each test asserts the exact outbox.
//
// Each fake row has one "hot" id at logit 100 and 0 elsewhere: greedy picks it, with
// log-probability exactly 0.
#include "engine/step_output.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "engine/prompt_scorer.h"
#include "engine/score_store.h"
#include "engine/sequence.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

constexpr int32_t kVocab = 8;
constexpr int32_t kBlock = 4;
constexpr uint32_t kEos = 7;

std::vector<float> Hot(uint32_t id) {
  std::vector<float> row(kVocab, 0.0f);
  row[id] = 100.0f;
  return row;
}

// The outbox as short strings, in order.
std::vector<std::string> Describe(const std::vector<RequestEvent>& events) {
  std::vector<std::string> out;
  for (const RequestEvent& e : events) {
    switch (e.kind) {
      case RequestEvent::Kind::kToken:
        out.push_back(
            absl::StrCat("token ", e.sample_index, ":", e.token.token_id, " lp ", e.token.logprob));
        break;
      case RequestEvent::Kind::kSampleFinished:
        out.push_back(absl::StrCat("finished ", e.sample_index, " ",
                                   e.finish_reason == FinishReason::kStop ? "stop" : "length"));
        break;
      case RequestEvent::Kind::kDone:
        out.push_back(absl::StrCat("done ", absl::StatusCodeToString(e.status.code()),
                                   " completion ", e.usage.completion_tokens));
        break;
      case RequestEvent::Kind::kPrompt: {
        std::vector<std::string> p;
        for (const PromptToken& t : e.prompt) {
          std::string s = absl::StrCat(t.token_id);
          if (t.has_logprob) absl::StrAppend(&s, "@", t.logprob, "/", t.top.size());
          p.push_back(s);
        }
        out.push_back(absl::StrCat("prompt ", absl::StrJoin(p, ",")));
        break;
      }
    }
  }
  return out;
}

class StepOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvCacheOptions c;
    c.pool.num_blocks = 16;
    c.pool.block_size = kBlock;
    c.pool.bytes_per_token = 8;
    cache_ = *KvCache::Create(c);
    output_ =
        std::make_unique<StepOutput>(StepOutput::Options{.cache = cache_.get(),
                                                         .scorer = &scorer_,
                                                         .eos_token_id = kEos,
                                                         .clock = [this] { return Time(++ticks_); },
                                                         .counters = &counters_,
                                                         .ttft = &ttft_,
                                                         .tpot = &tpot_});
  }

  static absl::Time Time(int64_t seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

  // A request for {1, 2, 3}, submitted at second 0, as the scheduler enqueues it.
  RequestState* Add(EngineRequest request) {
    request.prompt = {1, 2, 3};
    auto r = std::make_unique<RequestState>();
    r->request = std::move(request);
    output_->Prepare(r.get());
    r->root = CacheRootKey("manifest", "ns");
    r->submit_time = Time(0);
    requests_.push_back(std::move(r));
    return requests_.back().get();
  }

  // Admits the request's one sequence with its prompt computed, as a step leaves it.
  Sequence* Admit(RequestState* r) {
    auto seq = std::make_unique<Sequence>();
    seq->request = r;
    seq->pre_fork = r->request.num_samples > 1;
    seq->chain = std::make_shared<TokenChain>(r->root, kBlock, r->request.prompt);
    AdmissionRequest ar;
    ar.chain = seq->chain;
    ar.reserve_tokens = static_cast<int32_t>(r->request.prompt.size());
    absl::StatusOr<Admission> admission = cache_->Admit(ar);
    EXPECT_TRUE(admission.ok()) << admission.status();
    seq->cache_seq = admission->seq;
    seq->state = Sequence::State::kRunning;
    Compute(seq.get());
    r->sequences.push_back(std::move(seq));
    return r->sequences.back().get();
  }

  // Computes every token of `seq` (the last one is the next step's input).
  void Compute(Sequence* seq) {
    const int32_t n = static_cast<int32_t>(seq->chain->size());
    ASSERT_TRUE(cache_->Reserve(seq->cache_seq, n).ok());
    cache_->MarkComputed(seq->cache_seq, n);
  }

  std::vector<uint32_t> Tokens(const Sequence* seq) const {
    const absl::Span<const uint32_t> t = seq->chain->tokens();
    return {t.begin(), t.end()};
  }

  void Emit(Sequence* seq, uint32_t hot, int64_t second) {
    const std::vector<float> row = Hot(hot);
    output_->Emit(seq, row, Time(second), &forked_);
  }

  std::unique_ptr<KvCache> cache_;
  ScoreStore store_;
  PromptScorer scorer_{{.scores = &store_, .block_size = kBlock, .vocab_size = kVocab}};
  SchedulerCounters counters_;
  std::vector<double> ttft_, tpot_;
  int64_t ticks_ = 100;
  std::unique_ptr<StepOutput> output_;
  std::vector<std::unique_ptr<RequestState>> requests_;
  std::vector<Sequence*> forked_;
};

TEST_F(StepOutputTest, TheSampledTokenIsEmittedAppendedAndTimed) {
  RequestState* r = Add({.max_new_tokens = 4});
  Sequence* seq = Admit(r);
  Emit(seq, 5, /*second=*/10);
  EXPECT_THAT(Describe(r->outbox), ElementsAre("token 0:5 lp 0"));
  EXPECT_THAT(Tokens(seq), ElementsAre(1, 2, 3, 5));
  EXPECT_TRUE(seq->decoding);
  EXPECT_EQ(seq->generated, 1u);
  EXPECT_EQ(seq->generated_counts.at(5), 1u);
  EXPECT_EQ(r->usage.completion_tokens, 1u);
  EXPECT_EQ(counters_.generated_tokens, 1u);
  EXPECT_THAT(ttft_, ElementsAre(10.0));
  EXPECT_TRUE(tpot_.empty());
  Compute(seq);
  Emit(seq, 6, /*second=*/12);
  EXPECT_THAT(Describe(r->outbox), ElementsAre("token 0:5 lp 0", "token 0:6 lp 0"));
  EXPECT_THAT(Tokens(seq), ElementsAre(1, 2, 3, 5, 6));
  EXPECT_THAT(ttft_, ElementsAre(10.0));
  EXPECT_THAT(tpot_, ElementsAre(2.0));
  EXPECT_FALSE(r->ended);
  cache_->CheckInvariants();
}

TEST_F(StepOutputTest, EosEndsTheSampleWithStopAndReleasesItsBlocks) {
  RequestState* r = Add({.max_new_tokens = 4});
  Sequence* seq = Admit(r);
  Emit(seq, kEos, 10);
  EXPECT_THAT(Describe(r->outbox), ElementsAre("finished 0 stop", "done OK completion 0"));
  EXPECT_TRUE(r->ended);
  EXPECT_EQ(seq->state, Sequence::State::kFinished);
  EXPECT_EQ(seq->cache_seq, -1);
  EXPECT_EQ(cache_->Stats().num_sequences, 0);
  EXPECT_THAT(Tokens(seq), ElementsAre(1, 2, 3));  // the stop token is not appended
  EXPECT_EQ(counters_.generated_tokens, 0u);
  EXPECT_TRUE(ttft_.empty());
  cache_->CheckInvariants();
}

TEST_F(StepOutputTest, PrepareSetsUpTheStopIdsAndOnlyWithRepetitionPenaltyThePromptIds) {
  RequestState* plain = Add({.stop_token_ids = {5, 6, 5}});
  EXPECT_THAT(plain->stop_ids, UnorderedElementsAre(5, 6));
  EXPECT_TRUE(plain->prompt_token_set.empty());
  RequestState* penalised = Add({.sampling = {.repetition_penalty = 1.5f}});
  EXPECT_TRUE(penalised->stop_ids.empty());
  EXPECT_THAT(penalised->prompt_token_set, UnorderedElementsAre(1, 2, 3));
}

TEST_F(StepOutputTest, IgnoreEosEmitsEosLikeAnyToken) {
  RequestState* r = Add({.max_new_tokens = 4, .ignore_eos = true});
  Emit(Admit(r), kEos, 10);
  EXPECT_THAT(Describe(r->outbox), ElementsAre("token 0:7 lp 0"));
}

TEST_F(StepOutputTest, AStopIdEndsTheSampleWithStop) {
  RequestState* r = Add({.max_new_tokens = 4, .stop_token_ids = {5}});
  Sequence* seq = Admit(r);
  Emit(seq, 6, 10);
  Compute(seq);
  Emit(seq, 5, 11);
  EXPECT_THAT(Describe(r->outbox),
              ElementsAre("token 0:6 lp 0", "finished 0 stop", "done OK completion 1"));
}

TEST_F(StepOutputTest, MaxNewTokensEndsWithLengthAfterItsToken) {
  RequestState* r = Add({.max_new_tokens = 1});
  Sequence* seq = Admit(r);
  Emit(seq, 5, 10);
  EXPECT_THAT(Describe(r->outbox),
              ElementsAre("token 0:5 lp 0", "finished 0 length", "done OK completion 1"));
  // The last token is never forwarded, so it is not appended.
  EXPECT_THAT(Tokens(seq), ElementsAre(1, 2, 3));
  EXPECT_EQ(cache_->Stats().num_sequences, 0);
}

TEST_F(StepOutputTest, APromptForSeveralSamplesForksThenSamplesEach) {
  RequestState* r = Add({.max_new_tokens = 4, .num_samples = 3});
  Sequence* seq = Admit(r);
  Emit(seq, 5, 10);
  ASSERT_EQ(forked_.size(), 2u);
  EXPECT_FALSE(seq->pre_fork);
  EXPECT_EQ(r->sequences.size(), 3u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(forked_[i], r->sequences[i + 1].get());
    EXPECT_EQ(forked_[i]->sample_index, i + 1);
    EXPECT_EQ(forked_[i]->state, Sequence::State::kRunning);
    EXPECT_THAT(Tokens(forked_[i]), ElementsAre(1, 2, 3, 5));
  }
  EXPECT_THAT(Describe(r->outbox),
              ElementsAre("token 0:5 lp 0", "token 1:5 lp 0", "token 2:5 lp 0"));
  EXPECT_EQ(counters_.generated_tokens, 3u);
  EXPECT_THAT(ttft_, ElementsAre(10.0));  // the request's first token only
  EXPECT_EQ(cache_->Stats().num_sequences, 3);
  // Ending one sample is not the request's end.
  output_->FinishSequence(forked_[0], FinishReason::kStop);
  EXPECT_FALSE(r->ended);
  EXPECT_EQ(cache_->Stats().num_sequences, 2);
  cache_->CheckInvariants();
}

TEST_F(StepOutputTest, AnEchoedPromptAloneEndsEverySample) {
  RequestState* r = Add({.max_new_tokens = 0, .num_samples = 2, .echo_prompt = true});
  Sequence* seq = Admit(r);
  Emit(seq, 5, 10);
  EXPECT_THAT(Describe(r->outbox), ElementsAre("prompt 1,2,3", "finished 1 length",
                                               "finished 0 length", "done OK completion 0"));
  EXPECT_TRUE(forked_.empty());
  EXPECT_TRUE(r->prompt_sent);
  // Timed by the clock (its next tick), not the step's time.
  EXPECT_THAT(ttft_, ElementsAre(101.0));
  EXPECT_EQ(cache_->Stats().num_sequences, 0);
}

TEST_F(StepOutputTest, PromptLogprobsComeFromTheScorerCutToTheRequestsTop) {
  RequestState* r = Add({.max_new_tokens = 1, .prompt_logprobs = 1});
  Sequence* seq = Admit(r);
  scorer_.Begin(r, r->request.prompt);
  std::vector<float> rows = Hot(2);
  const std::vector<float> second = Hot(0);
  rows.insert(rows.end(), second.begin(), second.end());
  scorer_.ScoreRows(r, seq->chain->keys(), /*start=*/0, /*count=*/2, rows);
  Emit(seq, 5, 10);
  EXPECT_THAT(Describe(r->outbox), ElementsAre("prompt 1,2@0/1,3@-100/1", "token 0:5 lp 0",
                                               "finished 0 length", "done OK completion 1"));
  EXPECT_FALSE(scorer_.Scoring(r));
  EXPECT_EQ(counters_.prompt_logprob_tokens, 2u);
  EXPECT_EQ(counters_.prompt_logprob_tokens_cached, 0u);
}

TEST_F(StepOutputTest, EndRequestReleasesEverySequenceAndEndsOnce) {
  RequestState* r = Add({.max_new_tokens = 4, .num_samples = 2});
  Emit(Admit(r), 5, 10);
  output_->EndRequest(r, absl::CancelledError("request cancelled"));
  EXPECT_THAT(Describe(r->outbox),
              ElementsAre("token 0:5 lp 0", "token 1:5 lp 0", "done CANCELLED completion 2"));
  EXPECT_TRUE(r->ended);
  for (const auto& s : r->sequences) EXPECT_EQ(s->state, Sequence::State::kFinished);
  EXPECT_EQ(cache_->Stats().num_sequences, 0);
  cache_->CheckInvariants();
}

}  // namespace
}  // namespace prefixd
