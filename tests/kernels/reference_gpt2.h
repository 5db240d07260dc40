// A deliberately simple double-precision GPT-2 forward for tests: no paging, no packing, no
// threads, no code shared with kernels/cpu. Weights come straight from Model::ToFloat.
#ifndef PREFIXD_TESTS_KERNELS_REFERENCE_GPT2_H_
#define PREFIXD_TESTS_KERNELS_REFERENCE_GPT2_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/tokenizer.h"  // Model's destructor needs it complete

namespace prefixd::testing {

class ReferenceGpt2 {
 public:
  explicit ReferenceGpt2(const Model& model) : c_(model.config()) {
    auto f = [&](const std::string& name) { return model.ToFloat(model.Get(name)); };
    wte_ = f("wte.weight");
    wpe_ = f("wpe.weight");
    for (int l = 0; l < c_.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      Layer L;
      L.ln1_g = f(p + "ln_1.weight");
      L.ln1_b = f(p + "ln_1.bias");
      L.ln2_g = f(p + "ln_2.weight");
      L.ln2_b = f(p + "ln_2.bias");
      L.qkv_w = f(p + "attn.c_attn.weight");
      L.qkv_b = f(p + "attn.c_attn.bias");
      L.proj_w = f(p + "attn.c_proj.weight");
      L.proj_b = f(p + "attn.c_proj.bias");
      L.fc_w = f(p + "mlp.c_fc.weight");
      L.fc_b = f(p + "mlp.c_fc.bias");
      L.out_w = f(p + "mlp.c_proj.weight");
      L.out_b = f(p + "mlp.c_proj.bias");
      layers_.push_back(std::move(L));
    }
    lnf_g_ = f("ln_f.weight");
    lnf_b_ = f("ln_f.bias");
    if (const Tensor* head = model.Find("lm_head.weight")) head_ = model.ToFloat(*head);
  }

  // Logits of the last token of `tokens` (positions 0..n-1), computed from scratch.
  std::vector<double> LastLogits(const std::vector<uint32_t>& tokens) const {
    const int T = static_cast<int>(tokens.size());
    const int E = c_.n_embd, H = c_.n_head, D = E / H;
    using Mat = std::vector<std::vector<double>>;
    Mat x(T, std::vector<double>(E));
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < E; ++i)
        x[t][i] = double{wte_[size_t{tokens[t]} * E + i]} + wpe_[size_t(t) * E + i];
    for (const Layer& L : layers_) {
      Mat h = Norm(x, L.ln1_g, L.ln1_b);
      Mat qkv = Linear(h, L.qkv_w, L.qkv_b, E, 3 * E);
      Mat att(T, std::vector<double>(E, 0.0));
      for (int hd = 0; hd < H; ++hd) {
        for (int t = 0; t < T; ++t) {
          std::vector<double> s(t + 1);
          for (int j = 0; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < D; ++i) d += qkv[t][hd * D + i] * qkv[j][E + hd * D + i];
            s[j] = d / std::sqrt(double(D));
          }
          const double mx = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double& v : s) sum += (v = std::exp(v - mx));
          for (int j = 0; j <= t; ++j)
            for (int i = 0; i < D; ++i)
              att[t][hd * D + i] += s[j] / sum * qkv[j][2 * E + hd * D + i];
        }
      }
      Add(x, Linear(att, L.proj_w, L.proj_b, E, E));
      Mat fc = Linear(Norm(x, L.ln2_g, L.ln2_b), L.fc_w, L.fc_b, E, 4 * E);
      for (auto& row : fc)
        for (double& v : row)
          v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      Add(x, Linear(fc, L.out_w, L.out_b, 4 * E, E));
    }
    const Mat last = Norm(Mat{x.back()}, lnf_g_, lnf_b_);
    const std::vector<float>& head = head_.empty() ? wte_ : head_;  // [V, E]
    std::vector<double> logits(c_.vocab_size);
    for (int v = 0; v < c_.vocab_size; ++v) {
      double d = 0;
      for (int i = 0; i < E; ++i) d += last[0][i] * head[size_t(v) * E + i];
      logits[v] = d;
    }
    return logits;
  }

 private:
  struct Layer {
    std::vector<float> ln1_g, ln1_b, ln2_g, ln2_b, qkv_w, qkv_b, proj_w, proj_b, fc_w, fc_b, out_w,
        out_b;
  };
  using Mat = std::vector<std::vector<double>>;

  Mat Norm(const Mat& x, const std::vector<float>& g, const std::vector<float>& b) const {
    Mat out = x;
    for (auto& row : out) {
      const double n = static_cast<double>(row.size());
      double mean = 0, var = 0;
      for (double v : row) mean += v;
      mean /= n;
      for (double v : row) var += (v - mean) * (v - mean);
      var /= n;
      for (size_t i = 0; i < row.size(); ++i)
        row[i] = (row[i] - mean) / std::sqrt(var + c_.layer_norm_epsilon) * g[i] + b[i];
    }
    return out;
  }
  // x [T, in] times w [in, out] (HF Conv1D layout) plus b.
  static Mat Linear(const Mat& x, const std::vector<float>& w, const std::vector<float>& b, int in,
                    int out) {
    Mat y(x.size(), std::vector<double>(out));
    for (size_t t = 0; t < x.size(); ++t) {
      for (int o = 0; o < out; ++o) y[t][o] = b[o];
      for (int i = 0; i < in; ++i) {
        const double xi = x[t][i];
        const float* wr = w.data() + size_t(i) * out;
        for (int o = 0; o < out; ++o) y[t][o] += xi * wr[o];
      }
    }
    return y;
  }
  static void Add(Mat& x, const Mat& y) {
    for (size_t t = 0; t < x.size(); ++t)
      for (size_t i = 0; i < x[t].size(); ++i) x[t][i] += y[t][i];
  }

  ModelConfig c_;
  std::vector<float> wte_, wpe_, lnf_g_, lnf_b_, head_;
  std::vector<Layer> layers_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_KERNELS_REFERENCE_GPT2_H_
