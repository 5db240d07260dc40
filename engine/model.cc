#include "engine/model.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/check.h"
#include "base/escape.h"
#include "cache/sha256.h"
#include "engine/manifest.h"
#include "base/file.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "engine/weights_scan.h"

namespace prefixd {
namespace {

// Debian's absl has its own string_view type; StrCat takes only that one.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A read-only private mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path) {
    absl::StatusOr<int> opened = OpenRegularFile(path);
    if (!opened.ok()) return opened.status();
    const int fd = *opened;
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
    }
    auto file = std::shared_ptr<MappedFile>(new MappedFile());
    file->size_ = static_cast<size_t>(st.st_size);
    if (file->size_ > 0) {  // mmap refuses length 0; an empty file is reported by the parser
      void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": cannot mmap: ", std::strerror(err)));
      }
      file->data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    return std::shared_ptr<const MappedFile>(std::move(file));
  }

  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }

  absl::Span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  MappedFile() = default;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The tensors a GPT-2 checkpoint must hold, canonical names, with the shapes `c` implies.
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const ModelConfig& c) {
  const int64_t e = c.n_embd;
  std::map<std::string, std::vector<int64_t>> shapes = {
      {"wte.weight", {c.vocab_size, e}},
      {"wpe.weight", {c.n_positions, e}},
      {"ln_f.weight", {e}},
      {"ln_f.bias", {e}},
  };
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    shapes[p + "ln_1.weight"] = {e};
    shapes[p + "ln_1.bias"] = {e};
    shapes[p + "attn.c_attn.weight"] = {e, 3 * e};  // Conv1D: [in, out]
    shapes[p + "attn.c_attn.bias"] = {3 * e};
    shapes[p + "attn.c_proj.weight"] = {e, e};
    shapes[p + "attn.c_proj.bias"] = {e};
    shapes[p + "ln_2.weight"] = {e};
    shapes[p + "ln_2.bias"] = {e};
    shapes[p + "mlp.c_fc.weight"] = {e, 4 * e};
    shapes[p + "mlp.c_fc.bias"] = {4 * e};
    shapes[p + "mlp.c_proj.weight"] = {4 * e, e};
    shapes[p + "mlp.c_proj.bias"] = {e};
  }
  return shapes;
}

// The causal-mask buffers some exports include ("h.3.attn.bias", "h.3.attn.masked_bias"):
// not weights, so they are skipped.
bool IsAttentionBuffer(std::string_view name) {
  return absl::EndsWith(ToAbsl(name), ".attn.bias") ||
         absl::EndsWith(ToAbsl(name), ".attn.masked_bias");
}

// "NaN", "+Inf" or "-Inf": element `i` of a tensor FirstNonFinite flagged.
std::string NonFiniteName(DType dtype, const std::byte* data, int64_t i) {
  float f;
  if (dtype == DType::kF32) {
    std::memcpy(&f, data + 4 * i, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, data + 2 * i, 2);
    f = dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
  }
  if (std::isnan(f)) return "NaN";
  return f > 0 ? "+Inf" : "-Inf";
}

// What to add to "missing" for `file` of `dir`: the weights in another form Hugging Face
// writes (transformers shards a checkpoint above max_shard_size, 5 GB by default, so a gpt2-xl
// in fp32 comes in two files) say how to make the one file loaded, else the files it needs.
std::string MissingFileHint(const std::string& dir, std::string_view file) {
  if (file == "model.safetensors") {
    if (CheckRegularFile(absl::StrCat(dir, "/model.safetensors.index.json")).ok()) {
      return " (the directory holds a sharded checkpoint, model.safetensors.index.json and its "
             "shards, which prefixd does not load: save the model as one file, with "
             "save_pretrained(..., max_shard_size=\"100GB\"))";
    }
    if (CheckRegularFile(absl::StrCat(dir, "/pytorch_model.bin")).ok()) {
      return " (the directory holds only pytorch_model.bin, PyTorch's pickle, which prefixd "
             "does not load: save the model with save_pretrained(..., "
             "safe_serialization=True))";
    }
  }
  return " (a model directory holds config.json, model.safetensors, vocab.json and "
         "merges.txt)";
}

class LoadedModel : public Model {};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  for (std::string_view file : kManifestFiles) {
    const std::string path = absl::StrCat(dir, "/", ToAbsl(file));
    if (absl::Status s = CheckRegularFile(path); !s.ok()) {
      if (s.code() != absl::StatusCode::kNotFound) return s;  // says what is there instead
      return absl::NotFoundError(absl::StrCat(s.message(), MissingFileHint(dir, file)));
    }
  }
  auto model = std::make_unique<LoadedModel>();
  Model& m = *model;
  m.dir_ = dir;
  m.name_ = fs::path(dir).lexically_normal().filename().string();
  if (m.name_.empty()) m.name_ = fs::path(dir).lexically_normal().parent_path().filename().string();

  const std::string config_path = absl::StrCat(dir, "/config.json");
  absl::StatusOr<std::string> config_text = ReadWholeFile(config_path);
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<ModelConfig> config = ParseModelConfigJson(*config_text, config_path);
  if (!config.ok()) return config.status();
  m.config_ = *config;

  const std::string weights_path = absl::StrCat(dir, "/model.safetensors");
  absl::StatusOr<std::shared_ptr<const MappedFile>> mapped = MappedFile::Open(weights_path);
  if (!mapped.ok()) return mapped.status();
  const absl::Span<const std::byte> bytes = (*mapped)->bytes();
  absl::StatusOr<SafetensorsFile> st = ParseSafetensors(bytes, weights_path);
  if (!st.ok()) return st.status();

  const std::map<std::string, std::vector<int64_t>> expected = ExpectedShapes(m.config_);
  std::map<DType, int64_t> bytes_per_dtype;
  for (const SafetensorsEntry& e : st->tensors) {
    std::string_view name = e.name;
    if (absl::StartsWith(ToAbsl(name), "transformer.")) name.remove_prefix(strlen("transformer."));
    if (IsAttentionBuffer(name)) continue;  // whatever its dtype: the mask is computed
    if (!e.float_dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor \"", EscapeBytes(e.name), "\" has dtype ",
                       EscapeBytes(e.dtype_name), "; weights must be F32, F16 or BF16"));
    }
    std::vector<int64_t> want;
    if (name == "lm_head.weight") {
      want = {m.config_.vocab_size, m.config_.n_embd};
    } else if (auto it = expected.find(std::string(name)); it != expected.end()) {
      want = it->second;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": unexpected tensor \"",
                                                     EscapeBytes(e.name), "\" for a ",
                                                     m.config_.n_layer, "-layer GPT-2"));
    }
    if (e.shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor \"", EscapeBytes(e.name), "\" has shape ",
                       ShapeString(e.shape), " but config.json implies ", ShapeString(want)));
    }
    const std::byte* data = bytes.data() + st->data_start + e.begin;
    if (const int64_t bad = FirstNonFinite(e.dtype, {data, e.end - e.begin}); bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor \"", EscapeBytes(e.name), "\" holds ",
                       NonFiniteName(e.dtype, data, bad), " at element ", bad, " of ",
                       (e.end - e.begin) / DTypeSize(e.dtype),
                       ": the weights are corrupt (a model must be finite everywhere)"));
    }
    Tensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data = data;
    t.size_bytes = e.end - e.begin;
    if (!m.tensors_.emplace(std::string(name), std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": tensor \"", EscapeBytes(name),
                                                     "\" appears twice (with and without the "
                                                     "\"transformer.\" prefix)"));
    }
    bytes_per_dtype[e.dtype] += static_cast<int64_t>(e.end - e.begin);
    m.num_parameters_ += m.tensors_.find(name)->second.numel();
  }
  if (!m.config_.tie_word_embeddings && !m.tensors_.contains("lm_head.weight")) {
    return absl::InvalidArgumentError(absl::StrCat(
        weights_path, ": missing tensor \"lm_head.weight\" (config.json sets "
                      "tie_word_embeddings to false, so the output layer is not wte)"));
  }
  for (const auto& [name, shape] : expected) {
    if (!m.tensors_.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": missing tensor \"", name,
                                                     "\" (shape ", ShapeString(shape), ")"));
    }
  }
  int64_t most = -1;
  for (const auto& [dtype, n] : bytes_per_dtype) {
    if (n > most) {
      most = n;
      m.dtype_ = dtype;
    }
  }

  // Read once: the manifest below hashes the very bytes the tokenizer was built from.
  const std::string vocab_path = absl::StrCat(dir, "/vocab.json");
  const std::string merges_path = absl::StrCat(dir, "/merges.txt");
  absl::StatusOr<std::string> vocab_text = ReadWholeFile(vocab_path);
  if (!vocab_text.ok()) return vocab_text.status();
  absl::StatusOr<std::string> merges_text = ReadWholeFile(merges_path);
  if (!merges_text.ok()) return merges_text.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromText(*vocab_text, *merges_text, vocab_path, merges_path);
  if (!tokenizer.ok()) return tokenizer.status();
  m.tokenizer_ = *std::move(tokenizer);
  if (m.tokenizer_->vocab_size() > static_cast<size_t>(m.config_.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/vocab.json: holds ", m.tokenizer_->vocab_size(),
                     " tokens but config.json's vocab_size is ", m.config_.vocab_size));
  }

  // Every file is hashed from the bytes that were used (the weights from their mapping), not
  // re-read from disk, so the manifest describes what this process serves.
  std::array<Digest, 4> digests;
  digests[0] = Sha256Of(*config_text);
  digests[1] =
      Sha256Of(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  digests[2] = Sha256Of(*vocab_text);
  digests[3] = Sha256Of(*merges_text);
  m.manifest_sha256_ = ManifestSha256(digests);
  m.mapping_ = *std::move(mapped);
  return model;
}

const Tensor* Model::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor& Model::Get(std::string_view name) const {
  const Tensor* t = Find(name);
  PREFIXD_CHECK_MSG(t != nullptr, std::string(name).c_str());
  return *t;
}

std::vector<float> Model::ToFloat(const Tensor& t) const {
  const int64_t n = t.numel();
  PREFIXD_CHECK(static_cast<size_t>(n * DTypeSize(t.dtype)) == t.size_bytes);
  std::vector<float> out(static_cast<size_t>(n));
  if (t.dtype == DType::kF32) {
    if (n > 0) std::memcpy(out.data(), t.data, t.size_bytes);
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, t.data + 2 * i, 2);
    out[i] = t.dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
  }
  return out;
}

}  // namespace prefixd
