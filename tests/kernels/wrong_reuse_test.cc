// The known ways to reuse a KV cache wrongly (docs/ARCHITECTURE.md, "Why a cache is allowed").
// Each test first bypasses identity and plants the wrong rows, showing that the logits come
// out different from the correct ones (quietly: nothing fails, the numbers are just wrong);
// then it asks cache/'s KvCache, keyed by manifest + namespace + tokens, and shows that it
// never serves those rows, and that serving through it gives the correct logits bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "cache/kv_layout.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/kernels/kv_pool_access.h"
#include "tests/kernels/test_models.h"

namespace prefixd {
namespace {

using testing::Blocks;
using testing::MakeBackend;
using testing::Prefill;
using testing::RandomTokens;

constexpr int32_t kBlockSize = 16;
constexpr int64_t kNumBlocks = 24;

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double{std::abs(a[i] - b[i])});
  return m;
}

int64_t Argmax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

std::vector<int32_t> TableOf(const KvCache& cache, SequenceId seq) {
  const absl::Span<const int32_t> t = cache.BlockTable(seq);
  return {t.begin(), t.end()};
}

class WrongReuseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = testing::WriteAndLoad(TinyModelConfig(), 21, "reuse").release();
  }
  static void TearDownTestSuite() { delete model_; }

  void SetUp() override {
    ASSERT_NE(model_, nullptr);
    backend_ = MakeBackend(*model_, 2, kNumBlocks, kBlockSize);
    cache_ = NewCache(/*prefix_cache=*/true, kNumBlocks);
    root_ = CacheRootKey(model_->manifest_sha256(), CacheNamespace("tenant-a", ""));
    prompt_ = RandomTokens(40, 1);
    // The correct logits, computed from nothing in a backend of their own.
    auto fresh = MakeBackend(*model_, 1, kNumBlocks, kBlockSize);
    correct_ = Prefill(*fresh, prompt_, Blocks(0, 3), 0);
  }

  std::unique_ptr<KvCache> NewCache(bool prefix_cache, int32_t num_blocks) const {
    KvCacheOptions o;
    o.pool.num_blocks = num_blocks;
    o.pool.block_size = kBlockSize;
    const ModelConfig& c = model_->config();
    o.pool.bytes_per_token = KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
    o.enable_prefix_cache = prefix_cache;
    auto cache = KvCache::Create(o);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return std::move(*cache);
  }

  struct Served {
    SequenceId seq = -1;
    int32_t num_cached = 0;
    std::vector<int32_t> table;
    std::vector<float> logits;
  };
  // What the engine does: admit through the cache, run its copies, prefill the rest.
  static Served Serve(KvCache& cache, Backend& backend, const Digest& root,
                      const std::vector<uint32_t>& prompt) {
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(root, kBlockSize, prompt);
    r.reserve_tokens = static_cast<int32_t>(prompt.size());
    absl::StatusOr<Admission> a = cache.Admit(r);
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(backend.CopyBlocks(a->copies).ok());
    Served s;
    s.seq = a->seq;
    s.num_cached = a->num_cached;
    s.table = TableOf(cache, a->seq);
    s.logits = Prefill(backend, prompt, s.table, 0, /*from=*/a->num_cached);
    cache.MarkComputed(a->seq, static_cast<int32_t>(prompt.size()));
    s.table = TableOf(cache, a->seq);
    return s;
  }

  static void ExpectWrong(const std::vector<float>& wrong, const std::vector<float>& correct,
                          const char* what) {
    const double diff = MaxAbsDiff(wrong, correct);
    std::printf("%s: max |logit diff| %.4g, argmax %s\n", what, diff,
                Argmax(wrong) == Argmax(correct) ? "unchanged" : "changed");
    EXPECT_GT(diff, 1e-3) << what;
  }

  static inline Model* model_ = nullptr;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> cache_;
  Digest root_;
  std::vector<uint32_t> prompt_;
  std::vector<float> correct_;
};

TEST_F(WrongReuseTest, CacheBuiltForAnotherPrompt) {
  std::vector<uint32_t> other = prompt_;
  other[3] = (other[3] + 1) % 50257;  // same length, differs from token 3 on
  const Served built = Serve(*cache_, *backend_, root_, other);
  cache_->Release(built.seq);

  // Bypass: take the other prompt's two full blocks as this prompt's first 32 rows.
  const std::vector<int32_t> wrong_table = {built.table[0], built.table[1], 20};
  ExpectWrong(Prefill(*backend_, prompt_, wrong_table, 0, /*from=*/32), correct_,
              "another prompt's cache");

  // Identity: only the 3 tokens the prompts share are served; the rest is computed.
  const Served served = Serve(*cache_, *backend_, root_, prompt_);
  EXPECT_EQ(served.num_cached, 3);
  EXPECT_EQ(served.logits, correct_);
}

TEST_F(WrongReuseTest, StalePositionOffset) {
  // The same 32 tokens were cached, but as positions 16..47 of a longer prompt.
  std::vector<uint32_t> longer = RandomTokens(16, 2);
  longer.insert(longer.end(), prompt_.begin(), prompt_.end());
  ASSERT_NE(longer[0], prompt_[0]);
  const Served built = Serve(*cache_, *backend_, root_, longer);
  cache_->Release(built.seq);

  const std::vector<int32_t> wrong_table = {built.table[1], built.table[2], 20};
  ExpectWrong(Prefill(*backend_, prompt_, wrong_table, 0, /*from=*/32), correct_,
              "stale position offset");

  // Identity: block keys chain from position 0, so none of those blocks matches.
  const Served served = Serve(*cache_, *backend_, root_, prompt_);
  EXPECT_EQ(served.num_cached, 0);
  EXPECT_EQ(served.logits, correct_);
}

TEST_F(WrongReuseTest, ReusedBufferWithoutReset) {
  // Without prefix caching a released sequence's blocks go straight back to the free list;
  // a pool of 3 blocks forces the next sequence into exactly those blocks.
  std::unique_ptr<KvCache> small = NewCache(/*prefix_cache=*/false, 3);
  const Served before = Serve(*small, *backend_, root_, RandomTokens(40, 3));
  small->Release(before.seq);

  // Bypass: a sequence that forgot to reset its computed count resumes at 32 on the old rows.
  ExpectWrong(Prefill(*backend_, prompt_, before.table, 0, /*from=*/32), correct_,
              "reused buffer without reset");

  // Identity: the new sequence gets the same buffers but nothing counts as cached, and its
  // rows are written before they are read.
  const Served served = Serve(*small, *backend_, root_, prompt_);
  std::vector<int32_t> a = before.table, b = served.table;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  EXPECT_EQ(served.num_cached, 0);
  EXPECT_EQ(served.logits, correct_);
}

// Copies `src_dir`'s model into a new directory with one tensor scaled by `factor`.
std::string WriteScaledCopy(const std::string& src_dir, const std::string& tensor, float factor) {
  const std::string dir = testing::MakeTempDir("scaled");
  for (const char* f : {"config.json", "vocab.json", "merges.txt"}) {
    std::filesystem::copy_file(std::filesystem::path(src_dir) / f, std::filesystem::path(dir) / f);
  }
  std::ifstream in(std::filesystem::path(src_dir) / "model.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(std::string(bytes.data() + 8, header_len));
  bool found = false;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name.size() < tensor.size() ||
        name.compare(name.size() - tensor.size(), tensor.size(), tensor) != 0) {
      continue;
    }
    EXPECT_EQ((*it)["dtype"], "F32");
    const size_t begin = 8 + header_len + (*it)["data_offsets"][0].get<size_t>();
    const size_t end = 8 + header_len + (*it)["data_offsets"][1].get<size_t>();
    for (size_t off = begin; off < end; off += 4) {
      float v;
      std::memcpy(&v, bytes.data() + off, 4);
      v *= factor;
      std::memcpy(bytes.data() + off, &v, 4);
    }
    found = true;
  }
  EXPECT_TRUE(found) << tensor;
  std::ofstream out(std::filesystem::path(dir) / "model.safetensors", std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return dir;
}

TEST_F(WrongReuseTest, WeightsChangedByTwoPercentInOneLayer) {
  // Layer 0's attention weights: they shape every cached K/V row. (The last layer's MLP would
  // not do: no cached row depends on it, so such a cache would in fact be correct.)
  const std::string changed_dir = WriteScaledCopy(model_->dir(), "h.0.attn.c_attn.weight", 1.02f);
  auto changed = Model::Load(changed_dir);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_NE((*changed)->manifest_sha256(), model_->manifest_sha256());

  // The changed model computes the prompt; its K/V rows are planted in our backend's pool.
  auto other_backend = MakeBackend(**changed, 1, kNumBlocks, kBlockSize);
  const Digest other_root =
      CacheRootKey((*changed)->manifest_sha256(), CacheNamespace("tenant-a", ""));
  const Served built = Serve(*cache_, *other_backend, other_root, prompt_);
  cache_->Release(built.seq);
  WriteKvPool(*backend_, ReadKvPool(*other_backend));

  const std::vector<int32_t> wrong_table = {built.table[0], built.table[1], 20};
  const std::vector<float> wrong = Prefill(*backend_, prompt_, wrong_table, 0, /*from=*/32);
  ExpectWrong(wrong, correct_, "weights changed by 2% in one layer");
  // The quiet one: the difference is small next to the logits themselves.
  double scale = 0;
  for (float x : correct_) scale = std::max(scale, double{std::abs(x)});
  EXPECT_LT(MaxAbsDiff(wrong, correct_), 0.5 * scale);

  // Identity: another manifest is another root, so nothing matches, not even token 0; nor
  // does the same model under another tenant.
  AdmissionRequest r;
  r.chain = std::make_shared<TokenChain>(
      CacheRootKey(model_->manifest_sha256(), CacheNamespace("tenant-b", "")), kBlockSize,
      prompt_);
  r.reserve_tokens = 40;
  absl::StatusOr<AdmissionPlan> other_tenant = cache_->PlanAdmission(r);
  ASSERT_TRUE(other_tenant.ok());
  EXPECT_EQ(other_tenant->matched_tokens, 0);
  r.chain = std::make_shared<TokenChain>(other_root, kBlockSize, prompt_);
  absl::StatusOr<AdmissionPlan> same = cache_->PlanAdmission(r);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->matched_tokens, 32);  // the changed model itself would be served
  const Served served = Serve(*cache_, *backend_, root_, prompt_);
  EXPECT_EQ(served.num_cached, 0);
  EXPECT_EQ(served.logits, correct_);
}

}  // namespace
}  // namespace prefixd
