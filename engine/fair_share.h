// FairShare: which tenant's prefill work the scheduler serves next, so that admission and
// prefill chunks are shared among tenants by weight (start-time fair queuing over prompt
// tokens computed, the work-conserving form of deficit round robin).
//
// Each tenant has a service S = Σ tokens computed for it / its weight. Among the tenants
// with prefill work waiting in a step, the one with the least S goes next (ties: the one
// whose next item came first), and is charged for what it got. A tenant that had no work
// and gets some starts at the least S of the tenants that kept working (never below its
// own), so idling banks no credit; a lone tenant is served exactly in arrival order. Over
// any interval in which two tenants both have work, their tokens computed differ from the
// ratio of their weights by at most one item each (a chunk is never split for fairness).
//
// Invariant: S only grows, by tokens / weight. The maps hold the tenants seen, which the
// request path bounds (authenticated tenants only). Engine thread only.
#ifndef PREFIXD_ENGINE_FAIR_SHARE_H_
#define PREFIXD_ENGINE_FAIR_SHARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace prefixd {

class FairShare {
 public:
  // A tenant's weight from now on (>= 1); tenants never named weigh 1.
  void SetWeight(const std::string& tenant, uint32_t weight);
  uint32_t Weight(const std::string& tenant) const;

  // Starts a step: `active` are the tenants with prefill work now. Tenants active now but
  // not at the previous step catch up to the least service of those active at both.
  void BeginStep(const std::vector<std::string>& active);
  struct Candidate {
    const std::string* tenant;
    uint64_t arrival;  // the candidate item's order of arrival, for ties
  };
  // The index in `candidates` of the one to serve next (non-empty; each tenant at most
  // once, among this step's active ones).
  size_t Pick(const std::vector<Candidate>& candidates) const;
  // The tenant was served `tokens` tokens of prefill.
  void Charge(const std::string& tenant, int64_t tokens);
  double Service(const std::string& tenant) const;

 private:
  absl::flat_hash_map<std::string, uint32_t> weights_;
  absl::flat_hash_map<std::string, double> service_;
  absl::flat_hash_set<std::string> active_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_FAIR_SHARE_H_
