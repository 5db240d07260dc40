#include "cache/token_chain.h"

#include "base/check.h"
#include "cache/block_key.h"

namespace prefixd {

TokenChain::TokenChain(const Digest& root, int32_t block_size, absl::Span<const uint32_t> tokens)
    : root_(root), block_size_(block_size), tokens_(tokens.begin(), tokens.end()) {
  PREFIXD_CHECK(block_size_ > 0);
  keys_.reserve(tokens_.size() / block_size_);
  ExtendKeys();
}

void TokenChain::Append(absl::Span<const uint32_t> tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  ExtendKeys();
}

void TokenChain::Truncate(size_t num_tokens) {
  PREFIXD_CHECK(num_tokens <= tokens_.size());
  tokens_.resize(num_tokens);
  keys_.resize(num_tokens / block_size_);
}

absl::Span<const uint32_t> TokenChain::block(size_t i) const {
  PREFIXD_CHECK(i < keys_.size());
  return absl::MakeConstSpan(tokens_).subspan(i * block_size_, block_size_);
}

void TokenChain::ExtendKeys() {
  const size_t full = tokens_.size() / block_size_;
  while (keys_.size() < full) {
    const size_t i = keys_.size();
    keys_.push_back(ChainKey(i == 0 ? root_ : keys_[i - 1],
                             absl::MakeConstSpan(tokens_).subspan(i * block_size_, block_size_)));
  }
}

void TokenChain::CheckInvariants() const {
  PREFIXD_CHECK(keys_.size() == tokens_.size() / block_size_);
  Digest parent = root_;
  for (size_t i = 0; i < keys_.size(); ++i) {
    parent = ChainKey(parent, block(i));
    PREFIXD_CHECK_MSG(keys_[i] == parent, "a chain key does not match its tokens");
  }
}

}  // namespace prefixd
