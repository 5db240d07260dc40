// A Backend for scheduler tests that needs no model: each K/V "row" stores a hash of every
// token up to and including its position, chained through the rows the block table points
// at, and logits are a function of that hash. So the logits of a step equal
// ReferenceLogits(all tokens) exactly when every row the step read holds this sequence's own
// prefix — a wrong block table, a missed copy-on-write or a stale cached block changes them.
// Cheap enough for thousands of requests and for the sanitizer build.
#ifndef PREFIXD_TESTS_ENGINE_FAKE_BACKEND_H_
#define PREFIXD_TESTS_ENGINE_FAKE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/model_config.h"

namespace prefixd {

// The model a FakeBackend stands for: one tiny layer, `vocab` ids, the last one EOS.
inline ModelConfig FakeModelConfig(int32_t vocab) {
  ModelConfig c;
  c.n_layer = 1;
  c.n_head = 1;
  c.n_embd = 8;
  c.n_positions = 256;
  c.vocab_size = vocab;
  c.eos_token_id = vocab - 1;
  return c;
}

class FakeBackend final : public Backend {
 public:
  FakeBackend(int64_t num_blocks, int32_t block_size, int32_t vocab)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        vocab_(vocab),
        rows_(static_cast<size_t>(num_blocks) * block_size) {}

  static uint64_t Mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static uint64_t Chain(uint64_t prev, uint32_t token, int32_t pos) {
    return Mix(prev ^ Mix(static_cast<uint64_t>(token) << 20 ^ static_cast<uint64_t>(pos)));
  }
  static void LogitsOf(uint64_t h, int32_t vocab, std::vector<float>* out) {
    for (int32_t v = 0; v < vocab; ++v) {
      out->push_back(static_cast<float>(Mix(h ^ (0x1234567ull * (v + 1))) % 4096) / 256.0f);
    }
  }
  // The logits a correct engine sees after `tokens`.
  static std::vector<float> ReferenceLogits(absl::Span<const uint32_t> tokens, int32_t vocab) {
    uint64_t h = 0;
    for (size_t p = 0; p < tokens.size(); ++p) h = Chain(h, tokens[p], static_cast<int32_t>(p));
    std::vector<float> out;
    LogitsOf(h, vocab, &out);
    return out;
  }

  std::string device_name() const override { return "fake"; }
  std::string kv_numerics() const override { return "fake"; }
  DType dtype() const override { return DType::kF32; }
  int64_t num_blocks() const override { return num_blocks_; }
  int32_t block_size() const override { return block_size_; }
  int64_t kv_bytes_per_token() const override { return 8; }
  MemoryUsage memory_usage() const override { return {}; }

  // Every copy, read, write and step reaches the Run* calls below only through Backend's checks.
  absl::Status RunCopyBlocks(absl::Span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies) {
      for (int32_t r = 0; r < c.num_rows; ++r) {
        rows_[Index(c.dst, r)] = rows_[Index(c.src, r)];
      }
    }
    return absl::OkStatus();
  }

  // A row here is a (hash, position) pair, more than kv_bytes_per_token() holds: the disk
  // tier is tested on the CPU backend instead.
  absl::Status RunReadKvBlock(int32_t, absl::Span<uint8_t>) override {
    return absl::UnimplementedError("fake backend: no KV bytes");
  }
  absl::Status RunWriteKvBlock(int32_t, absl::Span<const uint8_t>) override {
    return absl::UnimplementedError("fake backend: no KV bytes");
  }

  // Positions are not bounded by a model here: the engine's own context checks are tested
  // with the CPU backend.
  StepLimits step_limits() const override { return {1 << 30, vocab_}; }
  absl::Status RunForward(absl::Span<const SequenceStep> steps,
                          std::vector<float>* logits) override {
    const int64_t call = forward_calls_.fetch_add(1);
    if (call == hook_call_ && hook_) hook_();
    absl::Notification* gate = gate_.load(std::memory_order_acquire);
    if (gate != nullptr && call == pause_call_.load(std::memory_order_relaxed)) {
      entered_.Notify();
      gate->WaitForNotification();
    }
    if (fail_at_call_ >= 0 && call == fail_at_call_) {
      absl::Status failure = absl::InternalError("fake backend: injected failure");
      if (fail_fatally_) failure.SetPayload(kFatalDeviceErrorPayload, absl::Cord("fatal"));
      return failure;
    }
    std::vector<StepRecord>& record = recorded_.emplace_back();
    for (const SequenceStep& s : steps) {
      record.push_back({s.start_pos, static_cast<int32_t>(s.token_ids.size()), s.want_logits});
      for (size_t i = 0; i < s.token_ids.size(); ++i) {
        const int32_t p = s.start_pos + static_cast<int32_t>(i);
        if (static_cast<size_t>(p / block_size_) >= s.block_table.size()) {
          return absl::InternalError("fake backend: block table too short");
        }
        uint64_t prev = 0;
        if (p > 0) {
          const Row& r = rows_[Index(s.block_table[(p - 1) / block_size_], (p - 1) % block_size_)];
          if (r.pos != p - 1) {
            return absl::InternalError(absl::StrFormat(
                "fake backend: row of position %d holds position %d", p - 1, r.pos));
          }
          prev = r.hash;
        }
        Row& out = rows_[Index(s.block_table[p / block_size_], p % block_size_)];
        out.hash = Chain(prev, s.token_ids[i], p);
        out.pos = p;
        if (s.want_all_logits || (s.want_logits && i + 1 == s.token_ids.size())) {
          LogitsOf(out.hash, vocab_, logits);
        }
      }
    }
    return absl::OkStatus();
  }

  // Forward() call number `call` (0-based) blocks until `gate` is notified; entered() fires
  // when it is reached. Set before the engine can call Forward, or (to gate a later call)
  // while no Forward call is in flight: the engine thread reads both.
  void set_gate(absl::Notification* gate, int64_t call = 0) {
    pause_call_.store(call, std::memory_order_relaxed);
    gate_.store(gate, std::memory_order_release);
  }
  // Runs `hook` on the engine thread at the start of Forward() call number `call`.
  void set_hook(int64_t call, std::function<void()> hook) {
    hook_call_ = call;
    hook_ = std::move(hook);
  }
  absl::Notification& entered() { return entered_; }
  void set_fail_at_call(int64_t call) { fail_at_call_ = call; }
  // The injected failure is a sticky device error (IsFatalDeviceError).
  void set_fail_fatally(bool fatal) { fail_fatally_ = fatal; }
  int64_t forward_calls() const { return forward_calls_.load(); }

  // What each Forward() call was asked to do, for scheduling tests (engine thread only).
  struct StepRecord {
    int32_t start_pos = 0;
    int32_t num_tokens = 0;
    bool want_logits = false;
    bool operator==(const StepRecord&) const = default;
  };
  const std::vector<std::vector<StepRecord>>& recorded() const { return recorded_; }

 private:
  struct Row {
    uint64_t hash = 0;
    int32_t pos = -1;
  };
  size_t Index(int32_t block, int32_t row) const {
    return static_cast<size_t>(block) * block_size_ + row;
  }

  const int64_t num_blocks_;
  const int32_t block_size_;
  const int32_t vocab_;
  std::vector<Row> rows_;
  std::vector<std::vector<StepRecord>> recorded_;
  std::atomic<int64_t> forward_calls_{0};
  int64_t fail_at_call_ = -1;
  bool fail_fatally_ = false;
  std::atomic<absl::Notification*> gate_{nullptr};
  std::atomic<int64_t> pause_call_{0};
  int64_t hook_call_ = -1;
  std::function<void()> hook_;
  absl::Notification entered_;
};

}  // namespace prefixd

#endif  // PREFIXD_TESTS_ENGINE_FAKE_BACKEND_H_
