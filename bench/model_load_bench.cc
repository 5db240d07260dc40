// What checking every weight for NaN and infinity adds to loading a model directory.
//
//   model_load_bench DIR [REPEATS]
//
// Times Model::Load(DIR) (which scans every float tensor once: engine/weights_scan.h) and,
// separately, FirstNonFinite over all of the loaded model's tensors; prints the median of
// REPEATS (default 5) runs of each, the bytes scanned and the scan's share of the load. The
// file is in the page cache after the first load, so these are warm figures.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/weights_scan.h"

namespace prefixd {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every weight tensor of a GPT-2 (canonical names, engine/model.h).
std::vector<std::string> TensorNames(const Model& m) {
  std::vector<std::string> names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
  if (m.Find("lm_head.weight") != nullptr) names.push_back("lm_head.weight");
  for (int i = 0; i < m.config().n_layer; ++i) {
    for (const char* part :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      names.push_back("h." + std::to_string(i) + "." + part);
    }
  }
  return names;
}

int Run(const std::string& dir, int repeats) {
  std::vector<double> load_s, scan_s;
  size_t bytes = 0;
  for (int i = 0; i < repeats; ++i) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
    const absl::Time t1 = absl::Now();
    if (!model.ok()) {
      std::fprintf(stderr, "model_load_bench: %s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    load_s.push_back(absl::ToDoubleSeconds(t1 - t0));
    bytes = 0;
    int64_t hits = 0;
    const absl::Time s0 = absl::Now();
    for (const std::string& name : TensorNames(**model)) {
      const Tensor& t = (*model)->Get(name);
      hits += FirstNonFinite(t.dtype, {t.data, t.size_bytes}) >= 0 ? 1 : 0;
      bytes += t.size_bytes;
    }
    scan_s.push_back(absl::ToDoubleSeconds(absl::Now() - s0));
    if (hits != 0) return 1;  // Load refuses such a model: cannot happen
  }
  const double load = Median(load_s), scan = Median(scan_s);
  std::printf("model %s: %.1f MB of weights\n", dir.c_str(), bytes / 1e6);
  std::printf("Model::Load (scan included): %.3f s median of %d\n", load, repeats);
  std::printf("scan alone:                  %.3f s median of %d (%.2f GB/s, %.0f%% of the load)\n",
              scan, repeats, bytes / scan / 1e9, 100.0 * scan / load);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: model_load_bench DIR [REPEATS]\n");
    return 2;
  }
  const int repeats = argc == 3 ? std::atoi(argv[2]) : 5;
  return prefixd::Run(argv[1], repeats < 1 ? 1 : repeats);
}
