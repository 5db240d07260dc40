// A tiny random GPT-2 (tools/random_model.h) on the CPU backend, written once per test
// binary into a temporary directory, and engines over it with a chosen pool size.
#ifndef PREFIXD_TESTS_ENGINE_CPU_ENGINE_FIXTURE_H_
#define PREFIXD_TESTS_ENGINE_CPU_ENGINE_FIXTURE_H_

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "cache/kv_layout.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/random_model.h"

namespace prefixd {

class TinyModel {
 public:
  // The model every test in the binary shares (written on first use).
  static const Model& Get() {
    static const Model* model = [] {
      const std::string dir =
          absl::StrCat(::testing::TempDir(), "/prefixd_engine_tiny_", ::getpid());
      RandomModelOptions o;
      o.out_dir = dir;
      o.config = TinyModelConfig();
      o.seed = 1234;
      const absl::Status written = WriteRandomModel(o);
      PREFIXD_CHECK_MSG(written.ok(), std::string(written.message()).c_str());
      auto loaded = Model::Load(dir);
      PREFIXD_CHECK_MSG(loaded.ok(), std::string(loaded.status().message()).c_str());
      std::filesystem::remove_all(dir);  // the backend copies the weights it needs
      return loaded->release();
    }();
    return *model;
  }
};

struct CpuEngineOptions {
  int64_t pool_blocks = 64;
  int32_t block_size = 16;
  int32_t max_batch_tokens = 256;
  bool prefix_cache = true;
  int32_t threads = 2;
  DType dtype = DType::kF32;  // of the weights; K/V stay fp32
  DiskTierOptions disk_tier;  // off unless dir is set
  RemoteTierOptions remote_tier;  // off unless url is set
  std::string manifest;       // empty: the model's own
  std::shared_ptr<KvEventSink> kv_events = nullptr;  // null: no KV events
};

// An engine with its own backend (declared first: destroyed after the engine).
struct CpuEngine {
  explicit CpuEngine(const CpuEngineOptions& o) {
    const Model& model = TinyModel::Get();
    const ModelConfig& c = model.config();
    const int64_t per_token = KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
    CpuBackendOptions b;
    b.model = &model;
    b.kv_pool.budget_bytes = o.pool_blocks * o.block_size * per_token;
    b.kv_pool.block_size = o.block_size;
    b.threads = o.threads;
    b.dtype = o.dtype;
    auto created = CreateCpuBackend(b);
    PREFIXD_CHECK_MSG(created.ok(), std::string(created.status().message()).c_str());
    backend = *std::move(created);
    PREFIXD_CHECK(backend->num_blocks() == o.pool_blocks);
    EngineOptions e;
    e.backend = backend.get();
    e.model_config = c;
    e.manifest_sha256 = model.manifest_sha256();
    e.max_batch_tokens = o.max_batch_tokens;
    e.enable_prefix_cache = o.prefix_cache;
    e.disk_tier = o.disk_tier;
    e.remote_tier = o.remote_tier;
    if (!o.manifest.empty()) e.manifest_sha256 = o.manifest;
    e.kv_events = o.kv_events;
    auto made = Engine::Create(e);
    PREFIXD_CHECK_MSG(made.ok(), std::string(made.status().message()).c_str());
    engine = *std::move(made);
  }
  ~CpuEngine() { engine->Shutdown(absl::ZeroDuration()); }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

}  // namespace prefixd

#endif  // PREFIXD_TESTS_ENGINE_CPU_ENGINE_FIXTURE_H_
