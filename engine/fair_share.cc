#include "engine/fair_share.h"

#include <algorithm>
#include <limits>

#include "base/check.h"

namespace prefixd {

void FairShare::SetWeight(const std::string& tenant, uint32_t weight) {
  PREFIXD_CHECK(weight >= 1);
  weights_[tenant] = weight;
}

uint32_t FairShare::Weight(const std::string& tenant) const {
  auto it = weights_.find(tenant);
  return it == weights_.end() ? 1 : it->second;
}

double FairShare::Service(const std::string& tenant) const {
  auto it = service_.find(tenant);
  return it == service_.end() ? 0.0 : it->second;
}

void FairShare::BeginStep(const std::vector<std::string>& active) {
  double floor = std::numeric_limits<double>::infinity();
  for (const std::string& t : active) {
    if (active_.contains(t)) floor = std::min(floor, Service(t));
  }
  absl::flat_hash_set<std::string> now;
  for (const std::string& t : active) {
    double& s = service_[t];
    if (!active_.contains(t) && floor != std::numeric_limits<double>::infinity()) {
      s = std::max(s, floor);  // idling banks no credit
    }
    now.insert(t);
  }
  active_ = std::move(now);
}

size_t FairShare::Pick(const std::vector<Candidate>& candidates) const {
  PREFIXD_CHECK(!candidates.empty());
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    const double a = Service(*candidates[i].tenant);
    const double b = Service(*candidates[best].tenant);
    if (a < b || (a == b && candidates[i].arrival < candidates[best].arrival)) best = i;
  }
  return best;
}

void FairShare::Charge(const std::string& tenant, int64_t tokens) {
  PREFIXD_CHECK(tokens >= 0);
  service_[tenant] += static_cast<double>(tokens) / Weight(tenant);
}

}  // namespace prefixd
