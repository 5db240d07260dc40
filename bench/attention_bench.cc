// The CPU backend's attention alone, as one GPT-2 (124M) decode step makes it: every layer's
// AttendBatch for a batch of sequences with K/V blocks of their own (or a shared prefix), for
// several heads-per-task splits, alternated round by round so that a shared machine's drift
// falls on all of them alike. Separates attention's memory traffic from the products'.
//
//   attention_bench [--threads 2] [--batch 8] [--context 128] [--rounds 15]
//                   [--heads-per-task 1,2,3,4,6,12] [--pool-blocks 256] [--shared 0]
//                   [--placement random|sequential]
//
// --shared N: the sequences' first N tokens (whole blocks) are one shared prefix, as when the
// prefix cache serves a common system prompt: its blocks are read by every sequence.
//
// The pool has GPT-2's geometry (12 layers, 12 heads of 64, blocks of 16 tokens; 1.18 MB a
// block); each sequence's blocks are drawn at random from it, as a long-running server's
// free list leaves them (--placement sequential: consecutive blocks, as a fresh pool gives
// them out). A step reads context x 12 layers x 2 x 768 floats per sequence
// (75 MB for 8 sequences at context 128), far more than the caches hold, so each layer's
// K/V comes from memory as in a real step. Per split: the median and minimum step over the
// rounds, and the K/V bytes read per second at the median.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "bench/bench_clock.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace prefixd {
namespace {

using bench::Now;

int Main(int argc, char** argv) {
  static constexpr FlagSpec kFlags[] = {{"threads"}, {"batch"},          {"context"},
                                        {"rounds"},  {"heads-per-task"}, {"pool-blocks"},
                                        {"shared"},  {"placement"}};
  absl::StatusOr<ParsedCommandLine> args =
      ParseArgv(absl::MakeConstSpan(argv + 1, static_cast<size_t>(argc - 1)), kFlags);
  if (!args.ok() || !args->positional.empty()) {
    std::fprintf(stderr, "attention_bench: %s (see the header of attention_bench.cc)\n",
                 args.ok() ? "unexpected positional argument"
                           : std::string(args.status().message()).c_str());
    return 2;
  }
  int64_t threads = 2, batch = 8, context = 128, rounds = 15, pool_blocks = 256, shared = 0;
  for (auto [name, field, max] :
       {std::tuple<const char*, int64_t*, int64_t>{"threads", &threads, 256},
        {"batch", &batch, 256},
        {"context", &context, 1023},
        {"rounds", &rounds, 10000},
        {"pool-blocks", &pool_blocks, 1 << 16},
        {"shared", &shared, 1023}}) {
    const std::optional<std::string> v = args->Flag(name);
    if (!v.has_value()) continue;
    const int64_t min = std::string_view(name) == "shared" ? 0 : 1;
    absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", name), min, max);
    if (!n.ok()) {
      std::fprintf(stderr, "attention_bench: %s\n", std::string(n.status().message()).c_str());
      return 2;
    }
    *field = *n;
  }
  const std::string placement = args->Flag("placement").value_or("random");
  if (placement != "random" && placement != "sequential") {
    std::fprintf(stderr, "attention_bench: --placement takes random or sequential, got %s\n",
                 placement.c_str());
    return 2;
  }
  std::vector<int32_t> splits = {1, 2, 3, 4, 6, 12};
  if (const std::optional<std::string> v = args->Flag("heads-per-task"); v.has_value()) {
    splits.clear();
    for (absl::string_view item : absl::StrSplit(*v, ',')) {
      absl::StatusOr<int64_t> n =
          ParseInteger(std::string_view(item.data(), item.size()), "--heads-per-task", 1, 12);
      if (!n.ok()) {
        std::fprintf(stderr, "attention_bench: %s\n", std::string(n.status().message()).c_str());
        return 2;
      }
      splits.push_back(static_cast<int32_t>(*n));
    }
  }
  const KvGeometry g{/*n_layer=*/12, /*n_head=*/12, /*head_dim=*/64, /*block_size=*/16};
  const int64_t e = int64_t{g.n_head} * g.head_dim;
  // The step's query sits at position `context`: context + 1 keys.
  const int64_t blocks_each = (context + 1 + g.block_size - 1) / g.block_size;
  const int64_t shared_blocks = std::min(shared, context + 1) / g.block_size;
  const int64_t blocks_needed = shared_blocks + batch * (blocks_each - shared_blocks);
  if (blocks_needed > pool_blocks) {
    std::fprintf(stderr,
                 "attention_bench: the sequences need a pool of at least %lld blocks "
                 "(--pool-blocks)\n",
                 static_cast<long long>(blocks_needed));
    return 2;
  }
  AlignedFloats kv = AllocateFloats(static_cast<size_t>(pool_blocks * g.block_stride()));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Values in [-1, 1) from a cheap generator: attention's cost does not depend on them, and
  // hundreds of MB of normal draws would take longer than the measurement.
  uint32_t state = 1;
  for (int64_t i = 0; i < pool_blocks * g.block_stride(); ++i) {
    state = state * 1664525u + 1013904223u;
    kv.get()[i] = static_cast<float>(static_cast<int32_t>(state)) * 0x1p-31f;
  }
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  if (placement == "random") std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int32_t>> tables(batch);
  auto next_id = ids.begin() + shared_blocks;
  for (int64_t s = 0; s < batch; ++s) {
    tables[s].assign(ids.begin(), ids.begin() + shared_blocks);
    tables[s].insert(tables[s].end(), next_id, next_id + (blocks_each - shared_blocks));
    next_id += blocks_each - shared_blocks;
  }
  // Rows of [q | k | v] as the QKV product leaves them; only q is read here.
  std::vector<float> qkv(batch * 3 * e), out(batch * e);
  for (float& x : qkv) x = dist(rng);
  std::vector<AttentionChunk> chunks;
  for (int64_t s = 0; s < batch; ++s) {
    chunks.push_back({qkv.data() + s * 3 * e, 3 * e, 1, static_cast<int32_t>(context),
                      tables[s].data(), out.data() + s * e, e});
  }
  ThreadPool pool(static_cast<int>(threads));
  // K/V bytes the step reads from its distinct blocks (a shared block counts once).
  const double bytes = static_cast<double>(shared_blocks * g.block_size +
                                           batch * (context + 1 - shared_blocks * g.block_size)) *
                       g.n_layer * 2 * e * 4;

  std::vector<std::vector<double>> steps(splits.size());
  std::vector<float> first_out;
  for (int64_t round = 0; round < rounds + 1; ++round) {  // round 0 warms up
    for (size_t i = 0; i < splits.size(); ++i) {
      const double t0 = Now();
      for (int32_t layer = 0; layer < g.n_layer; ++layer) {
        AttendBatch(chunks, kv.get(), g, layer, splits[i], &pool);
      }
      if (round > 0) steps[i].push_back(Now() - t0);
      // Every split computes the same bits (the last layer's output is compared).
      if (first_out.empty()) first_out = out;
      if (out != first_out) {
        std::fprintf(stderr, "attention_bench: %d heads per task changed the output\n", splits[i]);
        return 1;
      }
    }
  }
  std::printf(
      "attention of one decode step: %lld sequences at context %lld (%lld tokens shared), "
      "%.1f MB of distinct K/V, blocks placed %s, %lld threads, %lld rounds; the backend "
      "runs %d heads per task here\n\n| heads per task | median step | min step | K/V GB/s "
      "(median) |\n|---|---|---|---|\n",
      static_cast<long long>(batch), static_cast<long long>(context),
      static_cast<long long>(shared_blocks * g.block_size), bytes / 1e6, placement.c_str(),
      static_cast<long long>(threads), static_cast<long long>(rounds),
      AttentionHeadsPerTask(g.n_head, chunks, pool.num_threads()));
  for (size_t i = 0; i < splits.size(); ++i) {
    std::vector<double>& t = steps[i];
    std::sort(t.begin(), t.end());
    const double median = t[t.size() / 2];
    std::printf("| %d | %.3f ms | %.3f ms | %.1f |\n", splits[i], median * 1e3, t[0] * 1e3,
                bytes / median / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
