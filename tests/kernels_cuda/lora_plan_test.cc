// The CUDA backend's LoRA planning (kernels/cuda/lora_plan.h): which rows of a pass get which
// adapter, the device copy's layout, which copies stay resident, and what the backend
// refuses. Pure host code, so these run everywhere (no device needed).
#include "kernels/cuda/lora_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/step_plan.h"

namespace prefixd::cuda {
namespace {

ModelConfig SmallConfig() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.n_positions = 64;
  c.vocab_size = 100;
  return c;
}

// An adapter of `rank` for SmallConfig on `targets` (module widths only: planning reads no
// values). c_proj stands for both attn.c_proj and mlp.c_proj, as in PEFT.
LoraAdapter Adapter(const std::string& digest, int32_t rank,
                    const std::vector<std::string>& targets = {"c_attn", "c_proj", "c_fc"}) {
  const ModelConfig c = SmallConfig();
  const int64_t e = c.n_embd;
  LoraAdapter a;
  a.dir = "/adapters/" + digest;
  a.digest = digest;
  a.rank = rank;
  a.lora_alpha = 2.0f * rank;
  a.scaling = 2.0f;
  a.target_modules = targets;
  a.layers.resize(c.n_layer);
  const int64_t widths[kNumLoraTargets][2] = {{e, 3 * e}, {e, e}, {e, 4 * e}, {4 * e, e}};
  const char* names[kNumLoraTargets] = {"c_attn", "c_proj", "c_fc", "c_proj"};
  for (auto& layer : a.layers) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (std::find(targets.begin(), targets.end(), names[t]) == targets.end()) continue;
      layer[t].in = widths[t][0];
      layer[t].out = widths[t][1];
    }
  }
  return a;
}

SequenceStep Step(const std::vector<uint32_t>& tokens, const LoraAdapter* adapter) {
  SequenceStep s;
  s.token_ids = tokens;
  s.want_logits = true;
  s.adapter = adapter;
  return s;
}

TEST(LoraPlanTest, BaseAndThreeAdaptersGetOneSlotEachInOrderOfFirstUse) {
  const LoraAdapter a = Adapter("aa", 4), b = Adapter("bb", 8), c = Adapter("cc", 2, {"c_attn"});
  const std::vector<uint32_t> three(3), one(1), two(2);
  // base (3 rows), a (1), a (2), b (1), base (1), c (3), b (2)
  const std::vector<SequenceStep> steps = {
      Step(three, nullptr), Step(one, &a),   Step(two, &a), Step(one, &b),
      Step(one, nullptr),   Step(three, &c), Step(two, &b)};
  const auto passes = PlanPasses(steps, 64, 16);
  ASSERT_EQ(passes.size(), 1u);
  const LoraPassPlan plan = PlanLoraPass(steps, passes[0], 16);
  EXPECT_EQ(plan.adapters, (std::vector<const LoraAdapter*>{&a, &b, &c}));
  EXPECT_EQ(plan.row_slot,
            (std::vector<int32_t>{-1, -1, -1, 0, 0, 0, 1, -1, 2, 2, 2, 1, 1, -1, -1, -1}));
  // Consecutive rows of one adapter form one segment, even across steps.
  EXPECT_EQ(plan.segments, (std::vector<LoraSegment>{{3, 3, 0}, {6, 1, 1}, {8, 3, 2}, {11, 2, 1}}));
  EXPECT_EQ(plan.lora_rows, 9);
  EXPECT_EQ(plan.max_rank, 8);
  EXPECT_FALSE(plan.empty());
}

TEST(LoraPlanTest, AdaptersWithOneDigestShareASlotAndOthersDoNot) {
  // The same files loaded twice (two objects, one digest) are the same weights; a name
  // reloaded with other files has another digest, so another slot and other device weights.
  const LoraAdapter first = Adapter("d1", 4), again = Adapter("d1", 4), other = Adapter("d2", 4);
  const std::vector<uint32_t> one(1);
  const std::vector<SequenceStep> steps = {Step(one, &first), Step(one, &again), Step(one, &other)};
  const LoraPassPlan plan = PlanLoraPass(steps, PlanPasses(steps, 8, 8)[0], 3);
  EXPECT_EQ(plan.adapters, (std::vector<const LoraAdapter*>{&first, &other}));
  EXPECT_EQ(plan.row_slot, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(plan.segments, (std::vector<LoraSegment>{{0, 2, 0}, {2, 1, 1}}));
  EXPECT_EQ(DistinctAdapters(steps), (std::vector<const LoraAdapter*>{&first, &other}));
}

TEST(LoraPlanTest, BaseOnlyPassIsEmptyAndPaddingRowsHaveNoAdapter) {
  const std::vector<uint32_t> one(1);
  const std::vector<SequenceStep> base = {Step(one, nullptr), Step(one, nullptr)};
  const LoraPassPlan none = PlanLoraPass(base, PlanPasses(base, 8, 8)[0], 4);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.row_slot, (std::vector<int32_t>{-1, -1, -1, -1}));
  EXPECT_TRUE(none.segments.empty());
  EXPECT_EQ(none.max_rank, 0);
  EXPECT_TRUE(DistinctAdapters(base).empty());
  // A graph batch of 3 decode rows padded to its bucket of 4.
  const LoraAdapter a = Adapter("aa", 16);
  const std::vector<SequenceStep> mixed = {Step(one, &a), Step(one, nullptr), Step(one, &a)};
  const LoraPassPlan padded = PlanLoraPass(mixed, PlanPasses(mixed, 8, 8)[0], 4);
  EXPECT_EQ(padded.row_slot, (std::vector<int32_t>{0, -1, 0, -1}));
  EXPECT_EQ(padded.segments, (std::vector<LoraSegment>{{0, 1, 0}, {2, 1, 0}}));
  EXPECT_EQ(padded.lora_rows, 2);
  EXPECT_EQ(padded.max_rank, 16);
}

TEST(LoraPlanTest, EachPassOfASplitStepGetsItsOwnRows) {
  const LoraAdapter a = Adapter("aa", 4), b = Adapter("bb", 4);
  const std::vector<uint32_t> ten(10), two(2);
  const std::vector<SequenceStep> steps = {Step(ten, &a), Step(two, &b)};
  const auto passes = PlanPasses(steps, 4, 4);  // {a 0-4}, {a 4-8}, {a 8-10, b 0-2}
  ASSERT_EQ(passes.size(), 3u);
  const LoraPassPlan p0 = PlanLoraPass(steps, passes[0], 4);
  const LoraPassPlan p2 = PlanLoraPass(steps, passes[2], 4);
  EXPECT_EQ(p0.adapters, (std::vector<const LoraAdapter*>{&a}));
  EXPECT_EQ(p0.segments, (std::vector<LoraSegment>{{0, 4, 0}}));
  EXPECT_EQ(p2.adapters, (std::vector<const LoraAdapter*>{&a, &b}));
  EXPECT_EQ(p2.row_slot, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(p2.segments, (std::vector<LoraSegment>{{0, 2, 0}, {2, 2, 1}}));
}

TEST(LoraPlanTest, ArenaHoldsTheTableThenEachModulesAAndBAligned) {
  const LoraAdapter a = Adapter("aa", 3, {"c_attn", "c_fc"});
  const int64_t e = SmallConfig().n_embd;
  // bf16 (2 bytes), 16-byte table entries: 2 layers x 4 modules = 128 bytes -> 256.
  const LoraArenaLayout layout = PlanLoraArena(a, 2, 2, 16);
  EXPECT_EQ(layout.table_offset, 0);
  ASSERT_EQ(layout.a_offset.size(), 8u);
  ASSERT_EQ(layout.b_offset.size(), 8u);
  // Layer 0: c_attn A [3, 8] (48 B -> 256), B^T [3, 24] (144 B -> 256); c_fc A [3, 8], B^T
  // [3, 32] (192 B -> 256); attn.c_proj and mlp.c_proj absent. Then layer 1 the same.
  EXPECT_EQ(layout.a_offset, (std::vector<int64_t>{256, -1, 768, -1, 1280, -1, 1792, -1}));
  EXPECT_EQ(layout.b_offset, (std::vector<int64_t>{512, -1, 1024, -1, 1536, -1, 2048, -1}));
  EXPECT_EQ(layout.bytes, 2304);
  for (int64_t off : layout.a_offset) EXPECT_EQ(off % 256 == 0 || off == -1, true);
  // fp32, rank 64: c_attn B^T is 64 x 24 x 4 = 6144 bytes, exactly 24 x 256.
  const LoraAdapter big = Adapter("bb", 64, {"c_attn"});
  const LoraArenaLayout f32 = PlanLoraArena(big, 2, 4, 16);
  EXPECT_EQ(f32.a_offset[0], 256);
  EXPECT_EQ(f32.b_offset[0], 256 + 64 * e * 4);
  EXPECT_EQ(f32.a_offset[4], 256 + 64 * e * 4 + 64 * 3 * e * 4);
  EXPECT_EQ(f32.bytes, 256 + 2 * (64 * e * 4 + 64 * 3 * e * 4));
}

TEST(LoraPlanTest, LruEvictsLeastRecentlyUsedOutsideTheStep) {
  LoraDeviceLru lru(/*max_adapters=*/3, /*max_bytes=*/1000);
  lru.Insert("a", 100);
  lru.Insert("b", 200);
  lru.Insert("c", 300);
  EXPECT_EQ(lru.size(), 3);
  EXPECT_EQ(lru.bytes(), 600);
  lru.Touch("a");  // b is now the least recently used
  // One more adapter: one must go, the oldest not in use.
  EXPECT_EQ(lru.Victims(1, 50, {}), (std::vector<std::string>{"b"}));
  EXPECT_EQ(lru.Victims(1, 50, {"b"}), (std::vector<std::string>{"c"}));
  // By bytes: 600 + 900 needs 500 freed: b (200) then c (300).
  EXPECT_EQ(lru.Victims(0, 900, {}), (std::vector<std::string>{"b", "c"}));
  // Within both limits: nothing.
  EXPECT_TRUE(lru.Victims(0, 400, {}).empty());
  // Everything the step uses is kept even when that leaves the cache over its limits.
  EXPECT_EQ(lru.Victims(2, 5000, {"a", "b"}), (std::vector<std::string>{"c"}));
  EXPECT_TRUE(lru.Victims(2, 5000, {"a", "b", "c"}).empty());
  lru.Erase("b");
  lru.Erase("missing");
  EXPECT_FALSE(lru.Contains("b"));
  EXPECT_TRUE(lru.Contains("a"));
  EXPECT_EQ(lru.size(), 2);
  EXPECT_EQ(lru.bytes(), 400);
  // A cap of 0 adapters keeps nothing between steps.
  LoraDeviceLru none(0, 1000);
  none.Insert("x", 1);
  EXPECT_EQ(none.Victims(0, 0, {}), (std::vector<std::string>{"x"}));
}

TEST(LoraPlanTest, RefusesAnotherModelsAdapterAndRanksAboveTheKernels) {
  const ModelConfig c = SmallConfig();
  EXPECT_TRUE(CheckCudaLoraAdapter(Adapter("aa", 8), c).ok());
  EXPECT_TRUE(CheckCudaLoraAdapter(Adapter("aa", kCudaLoraMaxRank), c).ok());
  const absl::Status rank = CheckCudaLoraAdapter(Adapter("aa", kCudaLoraMaxRank + 1), c);
  EXPECT_EQ(rank.code(), absl::StatusCode::kUnimplemented) << rank;
  EXPECT_NE(rank.message().find("rank 4097"), absl::string_view::npos) << rank;
  ModelConfig wider = c;
  wider.n_embd = 16;
  EXPECT_EQ(CheckCudaLoraAdapter(Adapter("aa", 8), wider).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace prefixd::cuda
