// Soak on the real CPU backend and a tiny random GPT-2: 2,000 random requests with shared
// prefixes, forks and cancellations on a 10-block pool (see soak_util.h for the checks).
// A sample of the completed greedy requests is re-run alone on a cold engine and must match.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/soak_util.h"

namespace prefixd {
namespace {

TEST(EngineCpuSoakTest, TwoThousandRandomRequestsOnATinyPool) {
  CpuEngine busy({.pool_blocks = 10, .block_size = 8, .max_batch_tokens = 64});
  CpuEngine cold({.pool_blocks = 16, .block_size = 8, .prefix_cache = false});
  int compared = 0;
  SoakOptions o;
  o.num_requests = 2000;
  o.vocab = 50257;
  o.seed = 2026;
  o.max_new_tokens = 4;  // the LM head of a 50,257-token vocabulary dominates: keep it short
  o.check_ok = [&](const EngineRequest& r, const RequestResult& got) {
    if (r.sampling.temperature != 0.0f || r.num_samples != 1 || ++compared % 25 != 0) return;
    const RequestResult alone = RunOne(*cold.engine, r);
    ASSERT_TRUE(alone.status.ok());
    EXPECT_EQ(got.samples[0], alone.samples[0]);
  };
  RunSoak(*busy.engine, o);
  EXPECT_GT(compared, 200);
}

}  // namespace
}  // namespace prefixd
