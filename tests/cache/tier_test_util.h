// A small block layout and block records (cache/block_record.h) for the tier tests.
#ifndef PREFIXD_TESTS_CACHE_TIER_TEST_UTIL_H_
#define PREFIXD_TESTS_CACHE_TIER_TEST_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/block_key.h"
#include "cache/block_record.h"
#include "gtest/gtest.h"

namespace prefixd::testing {

// 4 tokens x 2 (K, V) x 1 layer x 2 heads x 4 dims x 4 bytes = 256 data bytes.
inline BlockLayout SmallLayout(std::string_view manifest = "manifest-1") {
  BlockLayout l;
  l.manifest_key = Sha256Of(manifest);
  l.numerics_key = Sha256Of("numerics-1");
  l.dtype = 0;
  l.element_bytes = 4;
  l.block_size = 4;
  l.n_layer = 1;
  l.n_head = 2;
  l.head_dim = 4;
  return l;
}

inline const Digest& TestRoot() {
  static const Digest root = CacheRootKey("manifest-1", CacheNamespace("tenant", ""));
  return root;
}

// Block `index` of a chain under `parent`: tokens 100 * seed + 4 * index + (0..3), data a
// pattern of (seed, index).
inline BlockRecord MakeRecord(const BlockLayout& layout, const Digest& parent, uint32_t seed,
                              uint32_t index, const Digest& root = TestRoot()) {
  BlockRecord r;
  r.root = root;
  r.parent_key = parent;
  for (uint32_t i = 0; i < layout.block_size; ++i) r.tokens.push_back(100 * seed + 4 * index + i);
  r.key = ChainKey(parent, r.tokens);
  r.data.resize(static_cast<size_t>(layout.data_bytes()));
  for (size_t i = 0; i < r.data.size(); ++i) {
    r.data[i] = static_cast<uint8_t>(i * 7 + seed * 31 + index * 13);
  }
  return r;
}

// A chain of `n` blocks from `root`.
inline std::vector<BlockRecord> MakeChain(const BlockLayout& layout, uint32_t seed, int n,
                                          const Digest& root = TestRoot()) {
  std::vector<BlockRecord> out;
  Digest parent = root;
  for (int i = 0; i < n; ++i) {
    out.push_back(MakeRecord(layout, parent, seed, static_cast<uint32_t>(i), root));
    parent = out.back().key;
  }
  return out;
}

// SmallLayout with score sections of `top_k` entries per position.
inline BlockLayout ScoredLayout(uint32_t top_k = 3) {
  BlockLayout l = SmallLayout();
  l.score_top_k = top_k;
  return l;
}

// `r` with a score section: position j has logprob -(j + 1) / 8 (none at position 0 of a
// first block) and min(j + 1, top_k) descending entries with ids 1000 + seed + i.
inline BlockRecord WithScores(BlockRecord r, const BlockLayout& layout, uint32_t seed = 7) {
  r.scores.clear();
  for (uint32_t j = 0; j < layout.block_size; ++j) {
    PositionScore p;
    if (!(j == 0 && r.parent_key == r.root)) {
      p.has_logprob = true;
      p.logprob = -static_cast<float>(j + 1) / 8.0f;
      for (uint32_t i = 0; i < std::min(j + 1, layout.score_top_k); ++i) {
        p.top.push_back({1000 + seed + i, -0.1f * static_cast<float>(i) - 0.3f / (j + 1)});
      }
    }
    r.scores.push_back(p);
  }
  return r;
}

inline BlockExpectation ExpectationOf(const BlockRecord& r) {
  return BlockExpectation{.root = r.root, .key = r.key, .tokens = r.tokens};
}

// A fresh empty directory under the test temp dir, removed by the destructor.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("prefixd_disk_" + tag + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_CACHE_TIER_TEST_UTIL_H_
