// The disk cache tier end to end on the CPU backend and a tiny random GPT-2: outputs after a
// tier hit, after a restart on the same directory and after corrupted files are compared with
// cold runs bit for bit (==), and cached_prompt_tokens says how much came from disk. With KV
// events on, the DISK medium follows the directory: files found at a restart (parents first),
// written, deleted for the cap or for damage; a write that fails shows nothing.
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cache/block_key.h"
#include "cache/block_record.h"
#include "engine/engine.h"
#include "engine/kv_events.h"
#include "engine/kv_tiers.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cache/tier_test_util.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_peer.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/fake_backend.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kWait = absl::Seconds(30);

std::vector<uint32_t> RandomTokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> tok(0, 50255);
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(tok(rng));
  return out;
}

// 100 prompt tokens: 6 whole blocks of 16 (96 tokens) can come from disk.
EngineRequest Request(uint32_t seed, int prompt_tokens = 100, const std::string& ns = "tenant-a") {
  EngineRequest r;
  r.prompt = RandomTokens(seed, prompt_tokens);
  r.max_new_tokens = 20;
  r.ignore_eos = true;
  r.top_logprobs = 2;
  r.cache_namespace = ns;
  return r;
}

RequestResult Cold(const EngineRequest& r, DType dtype = DType::kF32) {
  CpuEngine cold({.pool_blocks = 64, .prefix_cache = false, .dtype = dtype});
  return RunOne(*cold.engine, r);
}

CpuEngineOptions WithTier(const std::string& dir, int64_t pool_blocks = 16,
                          DType dtype = DType::kF32) {
  CpuEngineOptions o{.pool_blocks = pool_blocks, .block_size = 16, .dtype = dtype};
  o.disk_tier.dir = dir;
  o.disk_tier.max_bytes = int64_t{256} << 20;
  return o;
}

std::vector<fs::path> BlockFiles(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".kvb") out.push_back(e.path());
  }
  return out;
}

// The file of block `index` of `prompt`'s chain in `ns`.
fs::path FileOfBlock(const std::string& dir, const std::vector<uint32_t>& prompt, int index,
                     const std::string& ns = "tenant-a") {
  Digest key = CacheRootKey(TinyModel::Get().manifest_sha256(), ns);
  for (int i = 0; i <= index; ++i) {
    key = ChainKey(key, absl::MakeConstSpan(prompt).subspan(16 * i, 16));
  }
  for (const fs::path& p : BlockFiles(dir)) {
    if (absl::StrContains(p.filename().string(), DigestHex(key))) return p;
  }
  ADD_FAILURE() << "no file for block " << index;
  return {};
}

// Runs `r` on an engine with a tier in `dir`, then shuts it down with a grace that lets it
// write its cached blocks (a restart's first half).
void RunAndShutDown(const std::string& dir, const EngineRequest& r, DType dtype = DType::kF32) {
  CpuEngine first(WithTier(dir, 16, dtype));
  const RequestResult out = RunOne(*first.engine, r);
  ASSERT_TRUE(out.status.ok()) << out.status;
  first.engine->Shutdown(absl::Seconds(10));
  // 100 prompt + 19 computed generated tokens: 7 whole blocks.
  EXPECT_EQ(first.engine->Stats().disk.spills, 7u);
  EXPECT_EQ(first.engine->Stats().disk.blocks, 7u);
}

TEST(EngineDiskTierTest, EvictedBlocksComeBackFromDiskWithTheSameTokens) {
  testing::ScratchDir dir("engine_hit");
  const EngineRequest a = Request(1);
  CpuEngine engine(WithTier(dir.path()));
  const RequestResult first = RunOne(*engine.engine, a);
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0u);
  // Two long prompts that need most of the 16-block pool: a's blocks are evicted (spilled).
  for (uint32_t seed : {2u, 3u}) {
    ASSERT_TRUE(RunOne(*engine.engine, Request(seed, 200)).status.ok());
  }
  ASSERT_TRUE(EngineTestPeer::FlushDiskTier(*engine.engine, absl::Now() + kWait));
  EngineStats s = engine.engine->Stats();
  EXPECT_GE(s.disk.spills, 7u);
  EXPECT_EQ(s.disk.spills_dropped, 0u);
  EXPECT_GT(s.cache.evictions, 0u);

  const RequestResult again = RunOne(*engine.engine, a);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.usage.cached_prompt_tokens, 96u);
  s = engine.engine->Stats();
  EXPECT_EQ(s.scheduler.disk_hit_tokens, 96u);
  EXPECT_EQ(HitTokens(s), 96u);
  EXPECT_EQ(s.disk.loads, 6u);
  EXPECT_EQ(s.disk.corrupt_blocks, 0u);
  EXPECT_EQ(engine.engine->DrainLatencies().disk_load.size(), 6u);
  const RequestResult cold = Cold(a);
  ASSERT_EQ(again.samples.size(), 1u);
  EXPECT_EQ(again.samples[0], cold.samples[0]);
  EXPECT_EQ(first.samples[0], cold.samples[0]);
}

TEST(EngineDiskTierTest, ARestartOnTheSameDirectoryServesThePrefixFromDisk) {
  testing::ScratchDir dir("engine_restart");
  const EngineRequest a = Request(4);
  RunAndShutDown(dir.path(), a);
  CpuEngine second(WithTier(dir.path()));
  EXPECT_EQ(second.engine->Stats().disk.blocks, 7u);
  const RequestResult warm = RunOne(*second.engine, a);
  ASSERT_TRUE(warm.status.ok()) << warm.status;
  EXPECT_EQ(warm.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(second.engine->Stats().scheduler.disk_hit_tokens, 96u);
  EXPECT_EQ(HitTokens(second.engine->Stats()), 96u);  // both tiers: all of it from disk
  EXPECT_EQ(warm.samples[0], Cold(a).samples[0]);
  // Longer prompt with the same start: the whole blocks of the first run's continuation
  // (generated tokens included) match too when the new prompt repeats them.
  EngineRequest b = a;
  b.prompt.push_back(7);
  EXPECT_EQ(RunOne(*second.engine, b).samples[0], Cold(b).samples[0]);
}

TEST(EngineDiskTierTest, AnotherNamespaceOrModelNeverHitsTheFiles) {
  testing::ScratchDir dir("engine_isolation");
  const EngineRequest a = Request(5);
  RunAndShutDown(dir.path(), a);
  {
    CpuEngine second(WithTier(dir.path()));
    EngineRequest other = a;
    other.cache_namespace = "tenant-b";
    const RequestResult out = RunOne(*second.engine, other);
    EXPECT_EQ(out.usage.cached_prompt_tokens, 0u);
    EXPECT_EQ(second.engine->Stats().disk.loads, 0u);
    EXPECT_EQ(out.samples[0], Cold(other).samples[0]);
  }
  CpuEngineOptions o = WithTier(dir.path());
  o.manifest = "another-model-manifest";
  CpuEngine third(o);
  EXPECT_EQ(third.engine->Stats().disk.blocks, 0u);  // the files are foreign to this layout
  const RequestResult out = RunOne(*third.engine, a);
  EXPECT_EQ(out.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(third.engine->Stats().disk.loads, 0u);
}

// A file damaged in each section (or missing) at block 2: blocks 0 and 1 come from disk, the
// rest is computed, the answer is the cold one.
TEST(EngineDiskTierTest, CorruptedFilesAreDroppedAndRecomputed) {
  testing::ScratchDir templ("engine_corrupt_template");
  const EngineRequest a = Request(6);
  RunAndShutDown(templ.path(), a);
  const RequestResult cold = Cold(a);
  const int64_t tokens_end = kBlockRecordHeaderBytes + 16 * 4;
  struct Damage {
    std::string name;
    std::function<void(const fs::path&)> apply;
  };
  auto flip = [](int64_t offset) {
    return [offset](const fs::path& p) {
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(offset);
      const char c = static_cast<char>(f.get());
      f.seekp(offset);
      f.put(static_cast<char>(c ^ 0x10));
    };
  };
  auto cut = [](int64_t size) { return [size](const fs::path& p) { fs::resize_file(p, size); }; };
  const int64_t file_size =
      static_cast<int64_t>(fs::file_size(FileOfBlock(templ.path(), a.prompt, 2)));
  const std::vector<Damage> damages = {
      {"header byte", flip(60)},
      {"token byte", flip(kBlockRecordHeaderBytes + 5)},
      {"data byte", flip(tokens_end + 1000)},
      {"checksum byte", flip(file_size - 3)},
      {"cut in the header", cut(100)},
      {"cut after the tokens", cut(tokens_end)},
      {"cut in the data", cut(tokens_end + 500)},
      {"cut in the checksum", cut(file_size - 10)},
      {"empty", cut(0)},
      {"another block's file",
       [&](const fs::path& p) {
         fs::copy_file(FileOfBlock(templ.path(), a.prompt, 3), p,
                       fs::copy_options::overwrite_existing);
       }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    testing::ScratchDir dir("engine_corrupt");
    fs::copy(templ.path(), dir.path(), fs::copy_options::recursive);
    fs::remove(fs::path(dir.path()) / "LOCK");
    d.apply(FileOfBlock(dir.path(), a.prompt, 2));
    CpuEngine engine(WithTier(dir.path()));
    const RequestResult out = RunOne(*engine.engine, a);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.usage.cached_prompt_tokens, 32u);
    const EngineStats s = engine.engine->Stats();
    EXPECT_EQ(s.disk.corrupt_blocks, 1u);
    EXPECT_EQ(s.disk.loads, 2u);
    EXPECT_EQ(s.scheduler.disk_hit_tokens, 32u);
    EXPECT_FALSE(
        fs::exists(fs::path(dir.path()) / FileOfBlock(templ.path(), a.prompt, 2).filename()));
    EXPECT_EQ(BlockFiles(dir.path()).size(), 6u);
    EXPECT_EQ(out.samples[0], cold.samples[0]);
  }
}

TEST(EngineDiskTierTest, ASecondEngineOnTheSameDirectoryIsRefusedClearly) {
  testing::ScratchDir dir("engine_lock");
  CpuEngine first(WithTier(dir.path()));
  EngineOptions e;
  e.backend = first.backend.get();
  e.model_config = TinyModel::Get().config();
  e.manifest_sha256 = TinyModel::Get().manifest_sha256();
  e.disk_tier.dir = dir.path();
  auto second = Engine::Create(e);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "in use by another prefixd process"))
      << second.status();
  e.enable_prefix_cache = false;
  e.disk_tier.dir = dir.path() + "/other";
  EXPECT_EQ(Engine::Create(e).status().code(), absl::StatusCode::kInvalidArgument);
}

// Half-precision and int8 weights keep fp32 K/V on the CPU: the files hold 4-byte elements and
// come back bit for bit (this aborted on the first eviction when the layout took its element
// size from the weights' dtype).
TEST(EngineDiskTierTest, HalfPrecisionWeightsSpillAndReloadTheirFp32Blocks) {
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kI8}) {
    SCOPED_TRACE(DTypeName(dtype));
    testing::ScratchDir dir("engine_half");
    const EngineRequest a = Request(11);
    CpuEngine engine(WithTier(dir.path(), 16, dtype));
    const RequestResult first = RunOne(*engine.engine, a);
    ASSERT_TRUE(first.status.ok()) << first.status;
    for (uint32_t seed : {12u, 13u}) {
      ASSERT_TRUE(RunOne(*engine.engine, Request(seed, 200)).status.ok());
    }
    ASSERT_TRUE(EngineTestPeer::FlushDiskTier(*engine.engine, absl::Now() + kWait));
    EXPECT_GE(engine.engine->Stats().disk.spills, 7u);
    const RequestResult again = RunOne(*engine.engine, a);
    ASSERT_TRUE(again.status.ok()) << again.status;
    EXPECT_EQ(again.usage.cached_prompt_tokens, 96u);
    EXPECT_EQ(engine.engine->Stats().disk.loads, 6u);
    EXPECT_EQ(engine.engine->Stats().disk.corrupt_blocks, 0u);
    const RequestResult cold = Cold(a, dtype);
    EXPECT_EQ(again.samples[0], cold.samples[0]);
    EXPECT_EQ(first.samples[0], cold.samples[0]);
    // One file: header, 16 tokens, 16 x 2 x layers x heads x head_dim fp32 elements, checksum.
    const ModelConfig& c = TinyModel::Get().config();
    const std::vector<fs::path> files = BlockFiles(dir.path());
    ASSERT_FALSE(files.empty());
    EXPECT_EQ(fs::file_size(files[0]),
              static_cast<uintmax_t>(kBlockRecordHeaderBytes + 16 * 4 +
                                     16 * 2 * c.n_layer * c.n_head * c.head_dim() * 4 +
                                     kBlockRecordChecksumBytes));
  }
}

// The same prefix written under f32 weights is not the f16 backend's (other weights computed
// it) and the other way round: neither engine reads the other's files.
TEST(EngineDiskTierTest, FilesOfAnotherWeightsDTypeAreNeverRead) {
  testing::ScratchDir dir("engine_dtype_isolation");
  const EngineRequest a = Request(14);
  RunAndShutDown(dir.path(), a, DType::kF32);
  {
    CpuEngine half(WithTier(dir.path(), 16, DType::kF16));
    EXPECT_EQ(half.engine->Stats().disk.blocks, 0u);
    const RequestResult out = RunOne(*half.engine, a);
    EXPECT_EQ(out.usage.cached_prompt_tokens, 0u);
    EXPECT_EQ(half.engine->Stats().disk.loads, 0u);
    EXPECT_EQ(out.samples[0], Cold(a, DType::kF16).samples[0]);
  }
  {
    CpuEngine int8(WithTier(dir.path(), 16, DType::kI8));
    EXPECT_EQ(int8.engine->Stats().disk.blocks, 0u);
    EXPECT_EQ(RunOne(*int8.engine, a).usage.cached_prompt_tokens, 0u);
    EXPECT_EQ(int8.engine->Stats().disk.loads, 0u);
  }
  CpuEngine full(WithTier(dir.path()));
  EXPECT_EQ(full.engine->Stats().disk.blocks, 7u);  // its own files are all still there
  EXPECT_EQ(RunOne(*full.engine, a).usage.cached_prompt_tokens, 96u);
}

// The layout names who computed the K/V: the CPU backend's numerics at every dtype, and a
// backend of the same dtype and element size but other arithmetic gets another layout id.
TEST(EngineDiskTierTest, TheLayoutNamesTheBackendsNumericsAndKvElementSize) {
  CpuEngine f32({});
  CpuEngine f16({.dtype = DType::kF16});
  CpuEngine int8({.dtype = DType::kI8});
  EngineOptions e;
  e.model_config = TinyModel::Get().config();
  e.manifest_sha256 = TinyModel::Get().manifest_sha256();
  e.backend = f32.backend.get();
  const absl::StatusOr<BlockLayout> a = EngineBlockLayout(e);
  e.backend = f16.backend.get();
  const absl::StatusOr<BlockLayout> b = EngineBlockLayout(e);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->numerics_key, Sha256Of(kCpuKvNumerics));
  EXPECT_EQ(b->numerics_key, Sha256Of(kCpuKvNumerics));
  EXPECT_EQ(a->element_bytes, 4u);
  EXPECT_EQ(b->element_bytes, 4u);
  EXPECT_EQ(b->dtype, static_cast<uint32_t>(DType::kF16));
  EXPECT_NE(a->Id(), b->Id());
  // int8 weights: fp32 K/V of the same size and numerics name, another layout.
  e.backend = int8.backend.get();
  const absl::StatusOr<BlockLayout> c = EngineBlockLayout(e);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->element_bytes, 4u);
  EXPECT_EQ(c->dtype, static_cast<uint32_t>(DType::kI8));
  EXPECT_NE(c->Id(), a->Id());
  EXPECT_NE(c->Id(), b->Id());
  BlockLayout other_arithmetic = *a;
  other_arithmetic.numerics_key = Sha256Of("cuda r1 sm_90 cublas 130000");
  EXPECT_NE(other_arithmetic.Id(), a->Id());
  // 8 bytes a token is no whole element size for 2 x 2 layers x 2 heads x 32 dims.
  FakeBackend fake(16, 16, TinyModel::Get().config().vocab_size);
  e.backend = &fake;
  const absl::StatusOr<BlockLayout> bad = EngineBlockLayout(e);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "8 K/V bytes per token")) << bad.status();
  testing::ScratchDir dir("engine_bad_layout");
  e.disk_tier.dir = dir.path();
  EXPECT_EQ(Engine::Create(e).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineDiskTierTest, ShutdownWithoutGraceWritesNothingMore) {
  testing::ScratchDir dir("engine_no_grace");
  CpuEngine engine(WithTier(dir.path()));
  ASSERT_TRUE(RunOne(*engine.engine, Request(8)).status.ok());
  engine.engine->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(engine.engine->Stats().disk.spills, 0u);
  EXPECT_TRUE(BlockFiles(dir.path()).empty());
}

// A request parked on a disk load the disk holds back when the engine shuts down: it ends
// with UNAVAILABLE at once, and the engine (its loader thread too) stops once the read
// returns.
TEST(EngineDiskTierTest, ShutdownWhileALoadIsInFlightEndsTheParkedRequest) {
  testing::ScratchDir dir("engine_shutdown_loading");
  const EngineRequest a = Request(15);
  RunAndShutDown(dir.path(), a);
  absl::Notification reached, release;
  CpuEngineOptions o = WithTier(dir.path());
  o.disk_tier.read_hook = [&] {
    if (!reached.HasBeenNotified()) reached.Notify();
    release.WaitForNotification();
  };
  auto engine = std::make_unique<CpuEngine>(o);
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine->engine->Submit(a);
  ASSERT_TRUE(stream.ok()) << stream.status();
  reached.WaitForNotification();
  engine->engine->Shutdown(absl::ZeroDuration());
  const RequestResult out = Collect(**stream);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable) << out.status;
  EXPECT_EQ(engine->engine->Stats().disk.loads, 0u);
  release.Notify();
  engine.reset();  // joins the loader thread, which ends after its read
}

// With a grace, the parked request is not cut short: its load ends, it is admitted with the
// loaded blocks and answers as a cold run does.
TEST(EngineDiskTierTest, ADrainWithGraceLetsAParkedRequestFinish) {
  testing::ScratchDir dir("engine_drain_loading");
  const EngineRequest a = Request(16);
  RunAndShutDown(dir.path(), a);
  absl::Notification reached, release;
  CpuEngineOptions o = WithTier(dir.path());
  o.disk_tier.read_hook = [&] {
    if (!reached.HasBeenNotified()) reached.Notify();
    release.WaitForNotification();
  };
  CpuEngine engine(o);
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine.engine->Submit(a);
  ASSERT_TRUE(stream.ok()) << stream.status();
  reached.WaitForNotification();
  engine.engine->BeginShutdown(kWait);
  release.Notify();
  const RequestResult out = Collect(**stream);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(out.samples[0], Cold(a).samples[0]);
}

// ---- KV events of the disk tier ----

// The batches an engine publishes (on its thread), read by the test.
class RecordingSink : public KvEventSink {
 public:
  void Publish(std::vector<KvEvent> batch) override {
    absl::MutexLock lock(&mu_);
    batches_.push_back(std::move(batch));
  }
  std::vector<std::vector<KvEvent>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // Every event of every batch, in order.
  std::vector<KvEvent> events() {
    std::vector<KvEvent> out;
    for (const auto& b : batches()) out.insert(out.end(), b.begin(), b.end());
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::vector<KvEvent>> batches_ ABSL_GUARDED_BY(mu_);
};

// What replaying `events` leaves on DISK (block hashes), CHECKing that every removal is of a
// block stored before.
std::set<uint64_t> ReplayDisk(const std::vector<KvEvent>& events) {
  std::set<uint64_t> disk;
  for (const KvEvent& e : events) {
    if (const auto* s = std::get_if<KvBlockStored>(&e);
        s != nullptr && s->medium == KvMedium::kDisk) {
      EXPECT_TRUE(disk.insert(s->block_hash).second) << "stored twice: " << s->block_hash;
    } else if (const auto* r = std::get_if<KvBlockRemoved>(&e);
               r != nullptr && r->medium == KvMedium::kDisk) {
      EXPECT_EQ(disk.erase(r->block_hash), 1u) << "removed but not stored: " << r->block_hash;
    }
  }
  return disk;
}

// The block hashes of the directory's block files (DIR/<layout>-<hex key>.kvb): the first 16
// hex digits of the key are the hash (KvEventBlockHash).
std::set<uint64_t> DiskHashesOf(const std::string& dir) {
  std::set<uint64_t> out;
  for (const fs::path& p : BlockFiles(dir)) {
    out.insert(std::stoull(p.filename().string().substr(17, 16), nullptr, 16));
  }
  return out;
}

uint64_t HashOfBlock(const std::vector<uint32_t>& prompt, int index,
                     const std::string& ns = "tenant-a") {
  Digest key = CacheRootKey(TinyModel::Get().manifest_sha256(), ns);
  for (int i = 0; i <= index; ++i) {
    key = ChainKey(key, absl::MakeConstSpan(prompt).subspan(16 * i, 16));
  }
  return KvEventBlockHash(key);
}

// A restart reports every file it finds, in the batch right after start-up, parents first
// (a chain of 7 here, so exactly in chain order), with its tokens and no identity (no request
// has named its root yet); the shutdown that wrote them published them too.
TEST(EngineDiskTierEventsTest, ARestartReportsEveryFileFoundParentsFirst) {
  testing::ScratchDir dir("engine_events_restart");
  const EngineRequest a = Request(21);
  {
    auto sink = std::make_shared<RecordingSink>();
    CpuEngineOptions o = WithTier(dir.path());
    o.kv_events = sink;
    CpuEngine first(o);
    ASSERT_TRUE(RunOne(*first.engine, a).status.ok());
    first.engine->Shutdown(absl::Seconds(10));
    ASSERT_EQ(BlockFiles(dir.path()).size(), 7u);
    EXPECT_EQ(ReplayDisk(sink->events()), DiskHashesOf(dir.path()));
  }
  auto sink = std::make_shared<RecordingSink>();
  CpuEngineOptions o = WithTier(dir.path());
  o.kv_events = sink;
  CpuEngine second(o);
  // Published before Create returned: the engine's first batch.
  const std::vector<std::vector<KvEvent>> batches = sink->batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 7u);
  for (int i = 0; i < 7; ++i) {
    SCOPED_TRACE(i);
    const auto& stored = std::get<KvBlockStored>(batches[0][i]);
    EXPECT_EQ(stored.medium, KvMedium::kDisk);
    EXPECT_EQ(stored.block_size, 16);
    EXPECT_EQ(stored.lora_name, std::nullopt);
    EXPECT_EQ(stored.lora_id, std::nullopt);
    EXPECT_TRUE(stored.extra_keys.empty());
    if (i < 6) {  // block 6 holds the generated tokens after the prompt's 100
      EXPECT_EQ(stored.block_hash, HashOfBlock(a.prompt, i));
      EXPECT_EQ(stored.token_ids,
                std::vector<uint32_t>(a.prompt.begin() + 16 * i, a.prompt.begin() + 16 * i + 16));
    }
    if (i == 0) {
      EXPECT_EQ(stored.parent_block_hash, std::nullopt);
    } else {
      EXPECT_EQ(stored.parent_block_hash, std::get<KvBlockStored>(batches[0][i - 1]).block_hash);
    }
  }
  // The request served from those files: they stay, nothing on DISK changes.
  EXPECT_EQ(RunOne(*second.engine, a).usage.cached_prompt_tokens, 96u);
  EngineTestPeer::FlushKvEvents(*second.engine);
  EXPECT_EQ(ReplayDisk(sink->events()), DiskHashesOf(dir.path()));
}

// A cap of six files under a workload that spills more: each file the cap deletes is removed
// from DISK, exactly those, and the DISK replay equals the directory.
TEST(EngineDiskTierEventsTest, TheCapsDeletionsAreRemovalsFromDisk) {
  testing::ScratchDir dir("engine_events_cap");
  auto sink = std::make_shared<RecordingSink>();
  CpuEngineOptions o = WithTier(dir.path());
  o.disk_tier.max_bytes = 6 * (16 * 1024 + 1024);  // 16 KiB of K/V a block, and its record
  o.kv_events = sink;
  CpuEngine engine(o);
  for (uint32_t seed : {31u, 32u, 33u}) {
    ASSERT_TRUE(RunOne(*engine.engine, Request(seed, 200)).status.ok());
  }
  ASSERT_TRUE(EngineTestPeer::FlushDiskTier(*engine.engine, absl::Now() + kWait));
  EngineTestPeer::FlushKvEvents(*engine.engine);
  const EngineStats s = engine.engine->Stats();
  ASSERT_GT(s.disk.evicted_files, 0u) << "the cap deleted nothing: the test checks nothing";
  uint64_t stored = 0;
  std::vector<uint64_t> removed;
  for (const KvEvent& e : sink->events()) {
    if (const auto* st = std::get_if<KvBlockStored>(&e); st && st->medium == KvMedium::kDisk) {
      ++stored;
    }
    if (const auto* r = std::get_if<KvBlockRemoved>(&e); r && r->medium == KvMedium::kDisk) {
      removed.push_back(r->block_hash);
    }
  }
  EXPECT_EQ(stored, s.disk.spills);  // one store per file written
  EXPECT_EQ(removed.size(), s.disk.evicted_files);
  const std::set<uint64_t> on_disk = DiskHashesOf(dir.path());
  for (uint64_t h : removed) EXPECT_EQ(on_disk.count(h), 0u) << h;
  EXPECT_EQ(ReplayDisk(sink->events()), on_disk);
}

// A file found at start-up that fails its load is deleted: removed from DISK. Its head was
// sound (a data byte flipped), so it had been reported stored.
TEST(EngineDiskTierEventsTest, ACorruptFilesDeletionIsARemovalFromDisk) {
  testing::ScratchDir dir("engine_events_corrupt");
  const EngineRequest a = Request(22);
  RunAndShutDown(dir.path(), a);
  {
    std::fstream f(FileOfBlock(dir.path(), a.prompt, 2),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kBlockRecordHeaderBytes + 16 * 4 + 100);
    f.put('\x5a');
  }
  auto sink = std::make_shared<RecordingSink>();
  CpuEngineOptions o = WithTier(dir.path());
  o.kv_events = sink;
  CpuEngine engine(o);
  EXPECT_EQ(ReplayDisk(sink->events()).size(), 7u);
  EXPECT_EQ(RunOne(*engine.engine, a).usage.cached_prompt_tokens, 32u);
  EngineTestPeer::FlushKvEvents(*engine.engine);
  std::vector<uint64_t> removed;
  for (const KvEvent& e : sink->events()) {
    if (const auto* r = std::get_if<KvBlockRemoved>(&e); r && r->medium == KvMedium::kDisk) {
      removed.push_back(r->block_hash);
    }
  }
  EXPECT_EQ(removed, std::vector<uint64_t>{HashOfBlock(a.prompt, 2)});
  EXPECT_EQ(engine.engine->Stats().disk.corrupt_blocks, 1u);
  EXPECT_EQ(ReplayDisk(sink->events()), DiskHashesOf(dir.path()));
}

// Every write fails (a broken disk): the evicted blocks leave the pool, and nothing is ever
// reported on DISK.
TEST(EngineDiskTierEventsTest, ASpillThatIsNeverWrittenIsNeverOnDisk) {
  testing::ScratchDir dir("engine_events_failed");
  auto sink = std::make_shared<RecordingSink>();
  CpuEngineOptions o = WithTier(dir.path());
  o.disk_tier.write_file = [](const std::string&, const std::string&, std::string_view) {
    return EIO;
  };
  o.kv_events = sink;
  CpuEngine engine(o);
  for (uint32_t seed : {41u, 42u}) {
    ASSERT_TRUE(RunOne(*engine.engine, Request(seed, 200)).status.ok());
  }
  ASSERT_TRUE(EngineTestPeer::FlushDiskTier(*engine.engine, absl::Now() + kWait));
  EngineTestPeer::FlushKvEvents(*engine.engine);
  const EngineStats s = engine.engine->Stats();
  ASSERT_GT(s.disk.write_errors, 0u) << "nothing was spilled: the test checks nothing";
  int pool_removals = 0;
  for (const KvEvent& e : sink->events()) {
    if (const auto* st = std::get_if<KvBlockStored>(&e)) {
      EXPECT_NE(st->medium, KvMedium::kDisk);
    }
    if (const auto* r = std::get_if<KvBlockRemoved>(&e)) {
      EXPECT_EQ(r->medium, KvMedium::kCpu);
      ++pool_removals;
    }
  }
  EXPECT_EQ(static_cast<uint64_t>(pool_removals), s.cache.evictions);
}

}  // namespace
}  // namespace prefixd
