// Fork for tests: the children's chains are copies of the parent's, as the engine makes them.
#ifndef PREFIXD_TESTS_CACHE_FORK_CHAINS_H_
#define PREFIXD_TESTS_CACHE_FORK_CHAINS_H_

#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/token_chain.h"

namespace prefixd::testing {

inline std::vector<SequenceId> ForkCopies(KvCache& cache, SequenceId seq, int n) {
  std::vector<std::shared_ptr<TokenChain>> chains;
  for (int i = 0; i < n; ++i) chains.push_back(std::make_shared<TokenChain>(cache.Chain(seq)));
  return cache.Fork(seq, chains);
}

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_CACHE_FORK_CHAINS_H_
