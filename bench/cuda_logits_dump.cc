// cuda_logits_dump: runs prompts through the CUDA (or CPU) backend with greedy decoding and
// writes every logits row, for scripts/gpu-check to compare with Hugging Face transformers.
//
//   cuda_logits_dump --model=DIR --out=PREFIX [--device=cuda|cpu] [--dtype=f32]
//                    [--tokens=1,2,3:4,5] [--steps=4]
//
// Writes PREFIX.bin: float32 rows of vocab_size logits, and PREFIX.json:
// {"vocab_size": V, "sequences": [{"tokens": [...prompt and generated...],
//  "positions": [position of the token whose logits each row holds, ...]}]}; rows are in
// sequence order, then position order. All prompts are prefilled in one Forward(), then
// decoded together, one token per step, each appended greedily from this backend's logits.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/model.h"
#include "engine/tokenizer.h"  // Model's destructor needs the complete type
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"model", ""},
                                              {"out", ""},
                                              {"device", "cuda"},
                                              {"dtype", "f32"},
                                              {"tokens", "50256,464,2068,7586:40,1101"},
                                              {"steps", "4"}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos || !flags.count(a.substr(2, eq - 2))) {
      std::fprintf(stderr,
                   "usage: cuda_logits_dump --model=DIR --out=PREFIX [--device=cuda|cpu] "
                   "[--dtype=f32] [--tokens=1,2:3,4] [--steps=4]\n");
      return 2;
    }
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  auto model = Model::Load(flags["model"]);
  if (!model.ok()) {
    std::fprintf(stderr, "cuda_logits_dump: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const int64_t V = (*model)->config().vocab_size;
  const int32_t block_size = 16;
  absl::StatusOr<std::unique_ptr<Backend>> backend;
  if (flags["device"] == "cpu") {
    CpuBackendOptions o;
    o.model = model->get();
    o.kv_pool.budget_bytes = 256 << 20;
    backend = CreateCpuBackend(o);
  } else {
    CudaBackendOptions o;
    o.model = model->get();
    const std::optional<DType> dt = ParseDType(flags["dtype"]);
    if (!dt) return 2;
    o.dtype = *dt;
    o.kv_pool.budget_bytes = 256 << 20;
    backend = CreateCudaBackend(o);
  }
  if (!backend.ok()) {
    std::fprintf(stderr, "cuda_logits_dump: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::vector<std::vector<uint32_t>> seqs;
  for (absl::string_view prompt : absl::StrSplit(flags["tokens"], ':')) {
    std::vector<uint32_t> t;
    for (absl::string_view id : absl::StrSplit(prompt, ',')) {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(id, &v)) return 2;
      t.push_back(v);
    }
    seqs.push_back(std::move(t));
  }
  const int steps = std::atoi(flags["steps"].c_str());
  const int n_positions = (*model)->config().n_positions;
  std::vector<std::vector<int32_t>> tables(seqs.size());
  std::vector<std::vector<int32_t>> positions(seqs.size());
  std::vector<std::vector<float>> rows(seqs.size());
  int32_t next_block = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int blocks = (static_cast<int>(seqs[s].size()) + steps + block_size) / block_size;
    for (int b = 0; b < blocks; ++b) tables[s].push_back(next_block++);
  }
  for (int step = 0; step <= steps; ++step) {
    std::vector<SequenceStep> batch(seqs.size());
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = step == 0 ? static_cast<int>(seqs[s].size()) : 1;
      if (static_cast<int>(seqs[s].size()) > n_positions) return 2;
      batch[s].token_ids = absl::MakeConstSpan(seqs[s]).subspan(seqs[s].size() - n);
      batch[s].start_pos = static_cast<int32_t>(seqs[s].size()) - n;
      batch[s].block_table = tables[s];
      batch[s].want_logits = true;
    }
    std::vector<float> logits;
    if (absl::Status st = (*backend)->Forward(batch, &logits); !st.ok()) {
      std::fprintf(stderr, "cuda_logits_dump: %s\n", st.ToString().c_str());
      return 1;
    }
    for (size_t s = 0; s < seqs.size(); ++s) {
      const float* row = &logits[s * V];
      rows[s].insert(rows[s].end(), row, row + V);
      positions[s].push_back(static_cast<int32_t>(seqs[s].size()) - 1);
      if (step < steps) {
        seqs[s].push_back(static_cast<uint32_t>(std::max_element(row, row + V) - row));
      }
    }
  }
  const std::string out = flags["out"];
  FILE* bin = std::fopen((out + ".bin").c_str(), "wb");
  if (bin == nullptr) return 1;
  for (const auto& r : rows) std::fwrite(r.data(), sizeof(float), r.size(), bin);
  std::fclose(bin);
  nlohmann::json meta;
  meta["vocab_size"] = V;
  meta["device"] = (*backend)->device_name();
  meta["dtype"] = std::string(DTypeName((*backend)->dtype()));
  for (size_t s = 0; s < seqs.size(); ++s) {
    meta["sequences"].push_back({{"tokens", seqs[s]}, {"positions", positions[s]}});
  }
  FILE* js = std::fopen((out + ".json").c_str(), "w");
  if (js == nullptr) return 1;
  std::fputs(meta.dump().c_str(), js);
  std::fclose(js);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
