// Prompt logprobs with the disk tier, on the CPU backend and a tiny random GPT-2: score
// records follow their blocks into the tier and come back from it after a restart or an
// eviction; a scoring request takes from the tier only files that carry scores, while a plain
// request still takes any; a damaged score section drops the block, which is recomputed. Every
// prompt score and token equals a cold run without a prefix cache, bit for bit (==).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/block_key.h"
#include "cache/block_record.h"
#include "engine/engine.h"
#include "engine/score_store.h"
#include "gtest/gtest.h"
#include "tests/cache/tier_test_util.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_peer.h"
#include "tests/engine/engine_test_util.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

std::vector<uint32_t> RandomTokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> tok(0, 50255);
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(tok(rng));
  return out;
}

// 100 prompt tokens: 6 whole blocks of 16 (positions 0..95) can come from disk.
EngineRequest Scoring(const std::vector<uint32_t>& prompt, uint32_t top_n = 5) {
  EngineRequest r;
  r.prompt = prompt;
  r.prompt_logprobs = top_n;
  r.max_new_tokens = 2;
  r.ignore_eos = true;
  r.top_logprobs = 2;
  r.cache_namespace = "tenant-a";
  return r;
}

EngineRequest Plain(const std::vector<uint32_t>& prompt) {
  EngineRequest r = Scoring(prompt);
  r.prompt_logprobs.reset();
  return r;
}

CpuEngineOptions WithTier(const std::string& dir, int64_t pool_blocks = 16) {
  CpuEngineOptions o{.pool_blocks = pool_blocks, .block_size = 16};
  o.disk_tier.dir = dir;
  o.disk_tier.max_bytes = int64_t{256} << 20;
  return o;
}

// Scores and tokens of `got` equal those of the same request run cold, without a cache.
void ExpectEqualsCold(const EngineRequest& r, const RequestResult& got) {
  CpuEngine cold({.pool_blocks = 64, .prefix_cache = false});
  const RequestResult want = RunOne(*cold.engine, r);
  ASSERT_TRUE(want.status.ok() && got.status.ok()) << want.status << got.status;
  ASSERT_EQ(got.prompt.size(), want.prompt.size());
  for (size_t p = 0; p < want.prompt.size(); ++p) {
    ASSERT_EQ(got.prompt[p], want.prompt[p]) << "position " << p;
  }
  ASSERT_EQ(got.samples.size(), want.samples.size());
  for (size_t s = 0; s < want.samples.size(); ++s) EXPECT_EQ(got.samples[s], want.samples[s]);
}

uint64_t CachedScores(CpuEngine& e) {
  return e.engine->Stats().scheduler.prompt_logprob_tokens_cached;
}

void RunAndShutDown(const std::string& dir, const EngineRequest& r) {
  CpuEngine e(WithTier(dir));
  ASSERT_TRUE(RunOne(*e.engine, r).status.ok());
  e.engine->Shutdown(absl::Seconds(10));
}

// The file of block `index` of `prompt`'s chain.
fs::path FileOfBlock(const std::string& dir, const std::vector<uint32_t>& prompt, int index) {
  Digest key = CacheRootKey(TinyModel::Get().manifest_sha256(), "tenant-a");
  for (int i = 0; i <= index; ++i) {
    key = ChainKey(key, absl::MakeConstSpan(prompt).subspan(16 * i, 16));
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    if (absl::StrContains(e.path().filename().string(), DigestHex(key))) return e.path();
  }
  ADD_FAILURE() << "no file for block " << index;
  return {};
}

int64_t ScoreSectionBytes() { return 16 * (12 + 8 * int64_t{kScoreTopK}); }

// Flips one byte inside the score section of `file` (it lies just before the checksum).
void FlipScoreByte(const fs::path& file) {
  const auto size = static_cast<int64_t>(fs::file_size(file));
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const int64_t at = size - kBlockRecordChecksumBytes - ScoreSectionBytes() / 2;
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x10));
}

// Spilled at shutdown with their records; after a restart the 6 whole prompt blocks come
// from disk with their scores: positions 1..95 from records, position 96 from the recomputed
// last row of block 5.
TEST(EngineScoringDiskTest, ARestartServesScoresFromDiskEqualToAColdRun) {
  testing::ScratchDir dir("scoring_restart");
  const EngineRequest r = Scoring(RandomTokens(1, 100));
  RunAndShutDown(dir.path(), r);
  CpuEngine again(WithTier(dir.path()));
  const RequestResult got = RunOne(*again.engine, r);
  ExpectEqualsCold(r, got);
  EXPECT_EQ(got.usage.cached_prompt_tokens, 95u);
  EXPECT_EQ(CachedScores(again), 95u);
  EXPECT_EQ(again.engine->Stats().disk.loads, 6u);
  EXPECT_EQ(again.engine->Stats().disk.corrupt_blocks, 0u);
  // The records came back with the blocks: a second scoring run takes them from the pool.
  const RequestResult pool = RunOne(*again.engine, r);
  ExpectEqualsCold(r, pool);
  EXPECT_EQ(CachedScores(again), 190u);
  EXPECT_EQ(again.engine->Stats().disk.loads, 6u);
  EngineTestPeer::RunWithKvCache(*again.engine, [](const KvCache& cache) {
    cache.CheckInvariants();
  });
}

// Evicted by other traffic while the engine runs: the pool keeps the chain's first blocks
// (leaves are evicted first), the tier the rest; one scoring request takes both.
TEST(EngineScoringDiskTest, EvictedScoredBlocksComeBackFromDiskBesidePoolBlocks) {
  testing::ScratchDir dir("scoring_evict");
  const EngineRequest r = Scoring(RandomTokens(2, 100));
  CpuEngine e(WithTier(dir.path()));
  ASSERT_TRUE(RunOne(*e.engine, r).status.ok());
  // 180 + 2 tokens: 12 blocks of a 16-block pool, so some of r's 6 cached blocks go.
  ASSERT_TRUE(RunOne(*e.engine, Plain(RandomTokens(3, 180))).status.ok());
  // Written before r comes back (the engine's published stats may predate the writes, so
  // the loads below are what shows the spills).
  ASSERT_TRUE(EngineTestPeer::FlushDiskTier(*e.engine, absl::Now() + absl::Seconds(30)));
  const uint64_t before = CachedScores(e);
  const RequestResult got = RunOne(*e.engine, r);
  ExpectEqualsCold(r, got);
  EXPECT_EQ(CachedScores(e) - before, 95u);
  EXPECT_EQ(got.usage.cached_prompt_tokens, 95u);
  EXPECT_GT(e.engine->Stats().disk.loads, 0u);
  EXPECT_LT(e.engine->Stats().disk.loads, 6u);  // some blocks were still in the pool
}

// A plain request's blocks reach the disk without scores: a scoring request does not use
// them (computed instead), a plain one does; once a scoring request has scored the blocks,
// their eviction replaces the files with scored ones, which the next scoring request uses.
TEST(EngineScoringDiskTest, FilesWithoutScoresServePlainRequestsOnly) {
  testing::ScratchDir dir("scoring_unscored");
  const EngineRequest scoring = Scoring(RandomTokens(4, 100));
  const EngineRequest plain = Plain(scoring.prompt);
  RunAndShutDown(dir.path(), plain);
  const int64_t unscored =
      static_cast<int64_t>(fs::file_size(FileOfBlock(dir.path(), plain.prompt, 2)));
  {
    CpuEngine e(WithTier(dir.path()));
    const RequestResult got = RunOne(*e.engine, plain);
    ExpectEqualsCold(plain, got);
    EXPECT_EQ(got.usage.cached_prompt_tokens, 96u);
    EXPECT_EQ(e.engine->Stats().disk.loads, 6u);
  }
  {
    CpuEngine e(WithTier(dir.path()));
    const RequestResult got = RunOne(*e.engine, scoring);
    ExpectEqualsCold(scoring, got);
    EXPECT_EQ(got.usage.cached_prompt_tokens, 0u);
    EXPECT_EQ(CachedScores(e), 0u);
    EXPECT_EQ(e.engine->Stats().disk.loads, 0u);
    e.engine->Shutdown(absl::Seconds(10));
  }
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(FileOfBlock(dir.path(), plain.prompt, 2))),
            unscored + ScoreSectionBytes());
  CpuEngine e(WithTier(dir.path()));
  const RequestResult got = RunOne(*e.engine, scoring);
  ExpectEqualsCold(scoring, got);
  EXPECT_EQ(CachedScores(e), 95u);
  EXPECT_EQ(e.engine->Stats().disk.loads, 6u);
}

// A flipped byte in block 3's score section: blocks 0..2 load, block 3 is dropped (counted)
// and computed with everything after it.
TEST(EngineScoringDiskTest, ADamagedScoreSectionDropsTheBlockWhichIsRecomputed) {
  testing::ScratchDir dir("scoring_corrupt");
  const EngineRequest r = Scoring(RandomTokens(5, 100));
  RunAndShutDown(dir.path(), r);
  const fs::path damaged = FileOfBlock(dir.path(), r.prompt, 3);
  FlipScoreByte(damaged);
  CpuEngine e(WithTier(dir.path()));
  const RequestResult got = RunOne(*e.engine, r);
  ExpectEqualsCold(r, got);
  EXPECT_EQ(got.usage.cached_prompt_tokens, 47u);
  EXPECT_EQ(CachedScores(e), 47u);
  EXPECT_EQ(e.engine->Stats().disk.loads, 3u);
  EXPECT_EQ(e.engine->Stats().disk.corrupt_blocks, 1u);
  EXPECT_FALSE(fs::exists(damaged));
}

// The pool holds blocks 0..3 with records, the tier blocks 4 and 5, and block 4's file is
// damaged: the load brings nothing, and the request is admitted on the pool's records alone
// (positions 1..63), with the same scores as a cold run.
TEST(EngineScoringDiskTest, AFailedLoadAfterPoolBlocksFallsBackToThePoolsRecords) {
  testing::ScratchDir dir("scoring_requeue");
  const EngineRequest r = Scoring(RandomTokens(6, 100));
  RunAndShutDown(dir.path(), r);
  FlipScoreByte(FileOfBlock(dir.path(), r.prompt, 4));
  CpuEngine e(WithTier(dir.path()));
  // The first 65 tokens: blocks 0..3 come from disk and keep their records in the pool.
  const EngineRequest head =
      Scoring(std::vector<uint32_t>(r.prompt.begin(), r.prompt.begin() + 65));
  ASSERT_TRUE(RunOne(*e.engine, head).status.ok());
  ASSERT_EQ(e.engine->Stats().disk.loads, 4u);
  const uint64_t before = CachedScores(e);
  const RequestResult got = RunOne(*e.engine, r);
  ExpectEqualsCold(r, got);
  EXPECT_EQ(got.usage.cached_prompt_tokens, 63u);
  EXPECT_EQ(CachedScores(e) - before, 63u);
  EXPECT_EQ(e.engine->Stats().disk.loads, 4u);
  EXPECT_EQ(e.engine->Stats().disk.corrupt_blocks, 1u);
  EngineTestPeer::RunWithKvCache(*e.engine, [](const KvCache& cache) {
    cache.CheckInvariants();
    EXPECT_EQ(cache.Stats().blocks_active, 0);
  });
}

}  // namespace
}  // namespace prefixd
