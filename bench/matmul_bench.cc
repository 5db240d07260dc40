// The CPU backend's matrix products alone, as one GPT-2 (124M) decode step makes them: the
// 48 layer matrices and the LM head, for M rows (the batch), each instruction set and weight
// dtype. Separates the products' cost from attention and the rest of the forward pass, and
// shows where a batch stops riding on the weight stream.
//
//   matmul_bench [--threads 2] [--reps 7] [--rows 1,4,8,16] [--isa auto|avx2|avxvnni|avx512|amx|both ...]
//                [--dtype f32|f16|bf16|int8|all] [--weights stream|resident]
//
// Each figure is the best of --reps steps (wall and CPU time of all threads, each its own
// minimum); the weights (≈500 MB in f32) are far larger than the caches, so every step
// streams them from memory as a real decode step does. --weights resident instead multiplies
// by one 768 x 256 matrix (≈0.8 MB in f32) 200 times a step: it stays in L2, so the figure is
// the blocks' arithmetic rate alone, which the memory traffic of other tenants of a shared
// machine hardly moves (use --threads 1: both threads would share the one matrix's panels).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_clock.h"
#include "engine/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace prefixd {
namespace {

using bench::CpuNow;
using bench::Now;

struct Shape {
  int64_t k, n;
};

int Main(int argc, char** argv) {
  int threads = 2, reps = 7;
  std::vector<int64_t> rows = {1, 2, 4, 8, 16, 32, 64};
  std::vector<MatMulIsa> isas;
  std::vector<DType> dtypes = {DType::kF32};
  bool resident = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads") {
      threads = std::atoi(value.c_str());
    } else if (flag == "--reps") {
      reps = std::atoi(value.c_str());
    } else if (flag == "--rows") {
      rows.clear();
      std::stringstream ss(value);
      for (std::string item; std::getline(ss, item, ',');) rows.push_back(std::atoll(item.c_str()));
    } else if (flag == "--isa" && value == "both") {
      isas = {MatMulIsa::kAvx2, MatMulIsa::kAvx512};
    } else if (flag == "--isa" && ParseMatMulIsa(value)) {
      isas.push_back(*ParseMatMulIsa(value));  // repeat --isa to compare sets in one run
    } else if (flag == "--dtype" && value == "all") {
      dtypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8};
    } else if (flag == "--dtype" && ParseDType(value)) {
      dtypes = {*ParseDType(value)};
    } else if (flag == "--weights" && (value == "stream" || value == "resident")) {
      resident = value == "resident";
    } else {
      std::fprintf(stderr,
                   "usage: matmul_bench [--threads N] [--reps N] [--rows 1,8,...] "
                   "[--isa auto|avx2|avxvnni|avx512|amx|both ...] [--dtype f32|f16|bf16|int8|all] "
                   "[--weights stream|resident]\n");
      return 2;
    }
  }
  if (isas.empty()) isas = {MatMulIsa::kAuto};
  for (MatMulIsa isa : isas) {
    if (!MatMulIsaSupported(isa)) {
      std::fprintf(stderr, "matmul_bench: this CPU lacks that instruction set\n");
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || rows.empty() ||
      std::any_of(rows.begin(), rows.end(), [](int64_t m) { return m < 1 || m > 4096; })) {
    std::fprintf(stderr, "matmul_bench: --threads, --reps >= 1; --rows in [1, 4096]\n");
    return 2;
  }
  const int64_t e = 768, vocab = 50257;
  std::vector<Shape> shapes;
  int passes = 1;  // over `shapes` per step
  if (resident) {
    shapes.push_back({e, 256});
    passes = 200;
  } else {
    for (int l = 0; l < 12; ++l) {
      shapes.insert(shapes.end(), {{e, 3 * e}, {e, e}, {e, 4 * e}, {4 * e, e}});
    }
    shapes.push_back({e, vocab});
  }
  ThreadPool pool(threads);
  std::printf(resident ? "One 768 x 256 matrix, 200 times a step (resident in L2), %d threads, "
                         "best of %d\n\n"
                       : "GPT-2 decode-step products (48 layer matrices + LM head), %d threads, "
                         "best of %d\n\n",
              threads, reps);
  std::printf(
      "| dtype | ISA | rows | weights | wall ms | CPU ms | GFLOP/s (wall) | GB/s (wall) |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (DType dtype : dtypes) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<PackedMatrix> mats;
    double bytes = 0, flops_per_row = 0;  // read and computed per step
    double weight_bytes = 0;              // held
    for (const Shape& s : shapes) {
      std::vector<float> w(s.k * s.n);
      for (float& x : w) x = dist(rng);
      mats.push_back(PackedMatrix::Pack(w.data(), s.k, s.n, /*transposed=*/false, dtype));
      weight_bytes += mats.back().size_bytes();
      bytes += passes * mats.back().size_bytes();
      flops_per_row += passes * 2.0 * s.k * s.n;
    }
    const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
    std::vector<float> a(max_rows * 4 * e), c(max_rows * vocab);
    for (float& x : a) x = dist(rng);
    for (MatMulIsa isa : isas) {
      SetMatMulIsa(isa);
      const std::string isa_name = MatMulIsaInUse();  // what runs, "auto" resolved
      for (int64_t m : rows) {
        double best_wall = 1e30, best_cpu = 1e30;
        for (int r = 0; r < reps; ++r) {
          const double t0 = Now(), c0 = CpuNow();
          for (int p = 0; p < passes; ++p) {
            for (size_t i = 0; i < mats.size(); ++i) {
              MatMul(a.data(), m, shapes[i].k, mats[i], nullptr, c.data(), shapes[i].n, &pool);
            }
          }
          best_wall = std::min(best_wall, Now() - t0);
          best_cpu = std::min(best_cpu, CpuNow() - c0);
        }
        std::printf("| %s | %s | %lld | %.0f MB | %.2f | %.2f | %.0f | %.1f |\n",
                    std::string(DTypeName(dtype)).c_str(), isa_name.c_str(), static_cast<long long>(m),
                    weight_bytes / 1e6, best_wall * 1e3, best_cpu * 1e3,
                    m * flops_per_row / best_wall / 1e9, bytes / best_wall / 1e9);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
