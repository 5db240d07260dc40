// Exports a Hugging Face GPT-2 directory as a GGUF v3 file that llama.cpp loads as
// architecture "gpt2", all tensors F32, so llama.cpp can run the very same weights as prefixd
// (scripts/bench-peer compares the two side by side).
//
//   gguf_export MODEL_DIR OUT.gguf [f32|f16]
//
// f16 writes the matrices (every 2-D tensor) as F16, rounded to nearest even, and the 1-D
// tensors as F32: llama.cpp's "mostly F16" file type, as convert_hf_to_gguf.py --outtype f16
// writes it, and the same rounding as prefixd's --dtype f16 applies at load.
//
// The model is read through engine/model.h, so fp16/bf16 files and the "transformer." prefix
// work; every tensor is widened to fp32. Names and layout follow llama.cpp's
// convert_hf_to_gguf.py (class GPT2Model): HF's Conv1D weights are [in, out] row-major and
// are transposed to [out, in] row-major, which GGUF describes as ne = [in, out] (ggml lists
// the fastest-varying dimension first). Embeddings and the tied LM head are already [V, E]
// row-major (ne = [E, V]). As in the converter, a tied head is not written: llama.cpp's gpt2
// loader falls back to token_embd when "output.weight" is absent.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "base/file.h"
#include "engine/tokenizer.h"  // Model holds a unique_ptr<Tokenizer>
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

constexpr uint64_t kAlignment = 32;  // GGUF's default general.alignment

// GGUF metadata value types (gguf.h: enum gguf_type).
enum GgufType : uint32_t {
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kString = 8,
  kArray = 9,
};
constexpr uint32_t kGgmlTypeF32 = 0;
constexpr uint32_t kGgmlTypeF16 = 1;
// llama_token_type: 1 normal, 3 control, 4 user-defined (padding slots).
constexpr int32_t kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4;

// Little-endian serialisation into a growing byte string (x86 and every GGUF reader are LE).
class Writer {
 public:
  template <typename T>
  void Pod(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    out_ += s;
  }
  // One metadata key/value pair.
  void KeyU32(const std::string& k, uint32_t v) { Key(k, kU32), Pod(v); }
  void KeyF32(const std::string& k, float v) { Key(k, kF32), Pod(v); }
  void KeyStr(const std::string& k, const std::string& v) { Key(k, kString), Str(v); }
  void KeyStrArray(const std::string& k, const std::vector<std::string>& v) {
    Key(k, kArray);
    Pod<uint32_t>(kString);
    Pod<uint64_t>(v.size());
    for (const std::string& s : v) Str(s);
  }
  void KeyI32Array(const std::string& k, const std::vector<int32_t>& v) {
    Key(k, kArray);
    Pod<uint32_t>(kI32);
    Pod<uint64_t>(v.size());
    for (int32_t x : v) Pod(x);
  }
  void PadTo(uint64_t alignment) {
    out_.resize((out_.size() + alignment - 1) / alignment * alignment, '\0');
  }
  std::string& bytes() { return out_; }
  uint64_t keys() const { return keys_; }

 private:
  void Key(const std::string& k, GgufType t) {
    ++keys_;
    Str(k);
    Pod<uint32_t>(t);
  }
  std::string out_;
  uint64_t keys_ = 0;
};

// One tensor as it goes into the file: GGUF name, ne (fastest dimension first), fp32 data.
struct OutTensor {
  std::string name;
  std::vector<uint64_t> ne;
  std::vector<float> data;
};

// [rows, cols] row-major -> [cols, rows] row-major.
std::vector<float> Transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

// The tokenizer as GGUF stores it for tokenizer.ggml.model "gpt2": the byte-level BPE token
// strings of vocab.json in id order (e.g. "Ġthe", not raw bytes) and merges.txt's lines.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
};

absl::StatusOr<Vocab> ReadVocab(const Model& model) {
  const ModelConfig& c = model.config();
  auto vocab_text = ReadWholeFile(model.dir() + "/vocab.json");
  if (!vocab_text.ok()) return vocab_text.status();
  const nlohmann::json vocab =
      nlohmann::json::parse(*vocab_text, nullptr, /*allow_exceptions=*/false);
  if (!vocab.is_object()) return absl::InvalidArgumentError("vocab.json: not a JSON object");
  Vocab v;
  v.tokens.resize(c.vocab_size);
  v.types.assign(c.vocab_size, kTokenUserDefined);
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_unsigned() || id_json.get<uint64_t>() >= uint64_t(c.vocab_size))
      return absl::InvalidArgumentError(absl::StrCat("vocab.json: bad id for ", token));
    const auto id = id_json.get<uint32_t>();
    v.tokens[id] = token;
    v.types[id] = kTokenNormal;
  }
  // <|endoftext|> is a control token; slots the vocabulary leaves empty (a config vocab_size
  // larger than the tokenizer's) get unique padding names, as the converter does.
  for (int32_t id = 0; id < c.vocab_size; ++id) {
    if (v.types[id] != kTokenNormal) v.tokens[id] = absl::StrCat("[PAD", id, "]");
  }
  if (c.eos_token_id < v.types.size()) v.types[c.eos_token_id] = kTokenControl;
  if (c.bos_token_id < v.types.size()) v.types[c.bos_token_id] = kTokenControl;

  auto merges_text = ReadWholeFile(model.dir() + "/merges.txt");
  if (!merges_text.ok()) return merges_text.status();
  std::istringstream lines(*merges_text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    v.merges.push_back(line);
  }
  return v;
}

std::vector<OutTensor> CollectTensors(const Model& model) {
  // Model::Load has validated every shape against the config; llama.cpp checks them again.
  const ModelConfig& c = model.config();
  std::vector<OutTensor> out;
  // A 1-D tensor, or a matrix already [rows, cols] row-major (ne = [cols, rows]).
  auto copy = [&](const std::string& from, const std::string& to) {
    const Tensor& t = model.Get(from);
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    out.push_back({to, std::move(ne), model.ToFloat(t)});
  };
  // An HF Conv1D weight [in, out]: stored transposed, out rows of `in` floats, ne = [in, out].
  auto conv1d = [&](const std::string& from, const std::string& to) {
    const Tensor& t = model.Get(from);
    const int64_t in = t.shape[0], o = t.shape[1];
    out.push_back({to, {uint64_t(in), uint64_t(o)}, Transpose(model.ToFloat(t), in, o)});
  };
  copy("wte.weight", "token_embd.weight");
  copy("wpe.weight", "position_embd.weight");
  for (int32_t i = 0; i < c.n_layer; ++i) {
    const std::string h = absl::StrCat("h.", i, "."), b = absl::StrCat("blk.", i, ".");
    copy(h + "ln_1.weight", b + "attn_norm.weight");
    copy(h + "ln_1.bias", b + "attn_norm.bias");
    conv1d(h + "attn.c_attn.weight", b + "attn_qkv.weight");
    copy(h + "attn.c_attn.bias", b + "attn_qkv.bias");
    conv1d(h + "attn.c_proj.weight", b + "attn_output.weight");
    copy(h + "attn.c_proj.bias", b + "attn_output.bias");
    copy(h + "ln_2.weight", b + "ffn_norm.weight");
    copy(h + "ln_2.bias", b + "ffn_norm.bias");
    conv1d(h + "mlp.c_fc.weight", b + "ffn_up.weight");
    copy(h + "mlp.c_fc.bias", b + "ffn_up.bias");
    conv1d(h + "mlp.c_proj.weight", b + "ffn_down.weight");
    copy(h + "mlp.c_proj.bias", b + "ffn_down.bias");
  }
  copy("ln_f.weight", "output_norm.weight");
  copy("ln_f.bias", "output_norm.bias");
  if (model.Find("lm_head.weight") != nullptr) copy("lm_head.weight", "output.weight");
  return out;
}

absl::Status Export(const std::string& model_dir, const std::string& out_path, bool f16) {
  auto model_or = Model::Load(model_dir);
  if (!model_or.ok()) return model_or.status();
  const Model& model = **model_or;
  const ModelConfig& c = model.config();
  auto vocab = ReadVocab(model);
  if (!vocab.ok()) return vocab.status();
  const std::vector<OutTensor> tensors = CollectTensors(model);

  Writer w;
  w.Pod<uint32_t>(0x46554747);  // "GGUF"
  w.Pod<uint32_t>(3);           // version
  w.Pod<uint64_t>(tensors.size());
  const size_t key_count_at = w.bytes().size();
  w.Pod<uint64_t>(0);  // the number of metadata pairs, patched below
  w.KeyStr("general.architecture", "gpt2");
  w.KeyStr("general.name", model.name());
  w.KeyU32("general.file_type", f16 ? 1 : 0);  // LLAMA_FTYPE_MOSTLY_F16 / ALL_F32
  w.KeyU32("general.alignment", kAlignment);
  w.KeyU32("gpt2.context_length", c.n_positions);
  w.KeyU32("gpt2.embedding_length", c.n_embd);
  w.KeyU32("gpt2.feed_forward_length", 4 * c.n_embd);
  w.KeyU32("gpt2.block_count", c.n_layer);
  w.KeyU32("gpt2.attention.head_count", c.n_head);
  w.KeyF32("gpt2.attention.layer_norm_epsilon", c.layer_norm_epsilon);
  w.KeyU32("gpt2.vocab_size", c.vocab_size);
  w.KeyStr("tokenizer.ggml.model", "gpt2");
  w.KeyStr("tokenizer.ggml.pre", "gpt-2");
  w.KeyStrArray("tokenizer.ggml.tokens", vocab->tokens);
  w.KeyI32Array("tokenizer.ggml.token_type", vocab->types);
  w.KeyStrArray("tokenizer.ggml.merges", vocab->merges);
  w.KeyU32("tokenizer.ggml.bos_token_id", c.bos_token_id);
  w.KeyU32("tokenizer.ggml.eos_token_id", c.eos_token_id);

  const uint64_t keys = w.keys();
  w.bytes().replace(key_count_at, sizeof(keys), reinterpret_cast<const char*>(&keys), sizeof(keys));

  auto is_half = [f16](const OutTensor& t) { return f16 && t.ne.size() == 2; };
  auto data_bytes = [&](const OutTensor& t) {
    return t.data.size() * (is_half(t) ? sizeof(uint16_t) : sizeof(float));
  };
  uint64_t offset = 0;  // relative to the start of the data section
  for (const OutTensor& t : tensors) {
    w.Str(t.name);
    w.Pod<uint32_t>(t.ne.size());
    for (uint64_t d : t.ne) w.Pod<uint64_t>(d);
    w.Pod<uint32_t>(is_half(t) ? kGgmlTypeF16 : kGgmlTypeF32);
    w.Pod<uint64_t>(offset);
    offset += (data_bytes(t) + kAlignment - 1) / kAlignment * kAlignment;
  }
  w.PadTo(kAlignment);

  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", out_path, " for writing"));
  }
  out.write(w.bytes().data(), static_cast<std::streamsize>(w.bytes().size()));
  static const char kZeros[kAlignment] = {};
  for (const OutTensor& t : tensors) {
    const uint64_t bytes = data_bytes(t);
    if (is_half(t)) {
      std::vector<uint16_t> half(t.data.size());
      for (size_t i = 0; i < half.size(); ++i) half[i] = FloatToHalf(t.data[i]);
      out.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(bytes));
    } else {
      out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(bytes));
    }
    out.write(kZeros, static_cast<std::streamsize>((kAlignment - bytes % kAlignment) % kAlignment));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("write failed: ", out_path));
  std::fprintf(stderr, "gguf_export: %s -> %s (%zu tensors, %d layers, vocab %d, %.0f MB)\n",
               model_dir.c_str(), out_path.c_str(), tensors.size(), c.n_layer, c.vocab_size,
               (w.bytes().size() + offset) / 1e6);
  return absl::OkStatus();
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  const std::string type = argc == 4 ? argv[3] : "f32";
  if ((argc != 3 && argc != 4) || (type != "f32" && type != "f16")) {
    std::fprintf(stderr, "usage: gguf_export MODEL_DIR OUT.gguf [f32|f16]\n");
    return 2;
  }
  const absl::Status s = prefixd::Export(argv[1], argv[2], type == "f16");
  if (!s.ok()) {
    std::fprintf(stderr, "gguf_export: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
