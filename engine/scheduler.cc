#include "engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/check.h"
#include "engine/score_store.h"

namespace prefixd {
namespace {

// Tokens of a sequence: prompt + emitted.
int32_t Len(const Sequence& seq) { return static_cast<int32_t>(seq.chain->size()); }

// Read while the members are built, before the constructor's body can check the options.
int32_t BlockSizeOf(const KvCache* cache) {
  PREFIXD_CHECK(cache != nullptr);
  return cache->block_size();
}

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(options),
      backend_(options.backend),
      cache_(options.cache),
      scorer_(PromptScorer::Options{.scores = options.scores,
                                    .block_size = BlockSizeOf(options.cache),
                                    .vocab_size = options.model_config.vocab_size}),
      output_(StepOutput::Options{.cache = options.cache,
                                  .scorer = &scorer_,
                                  .eos_token_id = options.model_config.eos_token_id,
                                  .clock = options.clock,
                                  .counters = &counters_,
                                  .ttft = &ttft_,
                                  .tpot = &tpot_}),
      tenants_(TenantTable::Options{.cache = options.cache,
                                    .default_cache_share = options.tenant_cache_share},
               options.tenants) {
  PREFIXD_CHECK(backend_ != nullptr && cache_ != nullptr && options_.clock);
  PREFIXD_CHECK(options_.max_batch_tokens > 0 && options_.model_config.vocab_size > 0);
}

Scheduler::~Scheduler() = default;

void Scheduler::Enqueue(std::unique_ptr<RequestState> request) {
  output_.Prepare(request.get());
  request->tenant_id = tenants_.Id(request->request.tenant);
  // Set on every enqueue (cheap): a tenant's first sight included.
  fair_.SetWeight(request->request.tenant, tenants_.Policy(request->tenant_id).weight);
  arrival_[request.get()] = next_arrival_++;
  if (request->request.prompt_logprobs.has_value()) {
    scorer_.Begin(request.get(), request->request.prompt);
  }
  auto seq = std::make_unique<Sequence>();
  seq->request = request.get();
  seq->pre_fork = request->request.num_samples > 1;
  // Hashed once here: every admission attempt, the disk tier's match and the pool's index
  // read these keys.
  seq->chain =
      std::make_shared<TokenChain>(request->root, cache_->block_size(), request->request.prompt);
  waiting_.push_back(seq.get());
  request->sequences.push_back(std::move(seq));
  requests_.push_back(std::move(request));
  UpdateCounts();
}

void Scheduler::HandleCancellations() {
  bool any = false;
  for (auto& r : requests_) {
    if (r->ended) continue;
    if (r->stream->cancel_requested()) {
      output_.EndRequest(r.get(), absl::CancelledError("request cancelled"));
      any = true;
      continue;
    }
    for (uint32_t sample : r->stream->TakeSampleStops()) {
      for (auto& seq : r->sequences) {
        // A pre-fork sequence has emitted nothing yet, so no caller can have stopped it.
        if (seq->sample_index == sample && !seq->pre_fork &&
            seq->state != Sequence::State::kFinished) {
          output_.FinishSequence(seq.get(), FinishReason::kStop);
          any = true;
        }
      }
      if (r->ended) break;
    }
  }
  if (any) Prune();
}

void Scheduler::EndAll(const absl::Status& status) {
  for (auto& r : requests_) {
    if (!r->ended) output_.EndRequest(r.get(), status);
  }
  Prune();
}

void Scheduler::DrainLatencies(std::vector<double>* ttft, std::vector<double>* tpot,
                               std::vector<double>* disk_load, std::vector<double>* remote_load) {
  ttft->insert(ttft->end(), ttft_.begin(), ttft_.end());
  tpot->insert(tpot->end(), tpot_.begin(), tpot_.end());
  disk_load->insert(disk_load->end(), disk_load_.begin(), disk_load_.end());
  remote_load->insert(remote_load->end(), remote_load_.begin(), remote_load_.end());
  ttft_.clear();
  tpot_.clear();
  disk_load_.clear();
  remote_load_.clear();
}

void Scheduler::DrainAdapterTokens(AdapterTokenCounts* out) {
  for (const auto& [name, counts] : adapter_tokens_) {
    PromptTokenCounts& o = (*out)[name];
    o.queried_tokens += counts.queried_tokens;
    o.hit_tokens += counts.hit_tokens;
  }
  adapter_tokens_.clear();
}

void Scheduler::SortRunning() {
  std::sort(running_.begin(), running_.end(), [](const Sequence* a, const Sequence* b) {
    if (a->admit_order != b->admit_order) return a->admit_order < b->admit_order;
    return a->sample_index < b->sample_index;
  });
}

int64_t Scheduler::NowMillis() const { return absl::ToUnixMillis(options_.clock()); }

void Scheduler::SetTenantPolicies(const std::vector<TenantPolicy>& policies) {
  tenants_.SetPolicies(policies);
  for (size_t id = 0; id < tenants_.size(); ++id) {
    const TenantId t = static_cast<TenantId>(id);
    fair_.SetWeight(tenants_.Name(t), tenants_.Policy(t).weight);
  }
}

void Scheduler::WaitingByTenant(absl::flat_hash_map<std::string, int64_t>* out) const {
  for (const auto& r : requests_) {
    if (!r->ended && !r->admitted_once) ++(*out)[r->request.tenant];
  }
}

const std::string& Scheduler::TenantOf(const Sequence* seq) const {
  return tenants_.Name(seq->request->tenant_id);
}

std::vector<int32_t> Scheduler::PlanChunks(int32_t budget) {
  std::vector<int32_t> chunks(running_.size(), 0);
  // Each tenant's prefill work in its order: running prefills by admission, then waiting.
  struct Work {
    const std::string* tenant = nullptr;
    std::vector<const Sequence*> items;
    std::vector<int32_t> running_index;  // of the first items; -1 past them
    size_t next = 0;
  };
  std::vector<Work> work;
  absl::flat_hash_map<TenantId, size_t> by_tenant;
  auto of = [&](const Sequence* seq) -> Work& {
    auto [it, fresh] = by_tenant.try_emplace(seq->request->tenant_id, work.size());
    if (fresh) work.emplace_back().tenant = &TenantOf(seq);
    return work[it->second];
  };
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence* seq = running_[i];
    if (Len(*seq) - cache_->NumComputed(seq->cache_seq) == 1) continue;  // a decode
    Work& w = of(seq);
    w.items.push_back(seq);
    w.running_index.push_back(static_cast<int32_t>(i));
  }
  for (const Sequence* seq : waiting_) {
    // Parked on a load (or a match answer, or a fetch budget): admission skips it this step,
    // so it takes no turn (its tenant, with no other work, is not active: it sets nothing
    // aside and banks no credit meanwhile).
    if (options_.offloader != nullptr && options_.offloader->WaitsOnTiers(seq->tiers.get())) {
      continue;
    }
    Work& w = of(seq);
    w.items.push_back(seq);
    w.running_index.push_back(-1);
  }
  if (work.empty()) return chunks;
  std::vector<std::string> active;
  for (const Work& w : work) active.push_back(*w.tenant);
  fair_.BeginStep(active);
  // Simulated on a copy: the real charges are the tokens each item gets below and in
  // Admit(), whose cost (the uncached part) is known only once its admission is planned.
  FairShare sim = fair_;
  std::vector<FairShare::Candidate> candidates;
  std::vector<size_t> owner;
  while (budget > 0) {
    candidates.clear();
    owner.clear();
    for (size_t t = 0; t < work.size(); ++t) {
      const Work& w = work[t];
      if (w.next == w.items.size()) continue;
      candidates.push_back({w.tenant, arrival_.at(w.items[w.next]->request)});
      owner.push_back(t);
    }
    if (candidates.empty()) break;
    Work& w = work[owner[sim.Pick(candidates)]];
    const Sequence* seq = w.items[w.next];
    const int32_t index = w.running_index[w.next];
    ++w.next;
    // A waiting item is set aside what its admission would compute, so that a running
    // chunk of a tenant served more does not take its turn, and a cached prefix does not
    // keep the budget from it either.
    const int32_t uncomputed =
        index >= 0 ? Len(*seq) - cache_->NumComputed(seq->cache_seq) : UncachedTokens(*seq);
    const int32_t count = std::min(uncomputed, budget);
    if (index >= 0) chunks[static_cast<size_t>(index)] = count;
    sim.Charge(*w.tenant, count);
    budget -= count;
  }
  return chunks;
}

AdmissionRequest Scheduler::AdmissionFor(const Sequence& seq, int32_t* scored_pool) const {
  const RequestState* r = seq.request;
  AdmissionRequest ar;
  ar.chain = seq.chain;
  ar.reserve_tokens = Len(seq);  // the whole prompt: chunks never need blocks
  ar.readmission = r->admitted_once;
  ar.tenant = r->tenant_id;
  ar.now = NowMillis();
  const absl::Duration retention =
      std::min(r->request.cache_retention, options_.max_cache_retention);
  if (retention > absl::ZeroDuration()) {
    ar.retain_until = ar.now + absl::ToInt64Milliseconds(retention);
  }
  // A scoring request takes only leading blocks with records in the store (all indexed),
  // less the last one's last row: its logits score the first position after them, so it
  // is recomputed (into a copy of the block).
  // While it scores, the sequence holds the prompt alone: its chain's keys are the prompt's.
  *scored_pool = 0;
  if (scorer_.Scoring(r)) {
    *scored_pool = scorer_.RecordedPrefixBlocks(seq.chain->keys());
    ar.max_cached_tokens = *scored_pool > 0 ? *scored_pool * cache_->block_size() - 1 : 0;
  }
  return ar;
}

int32_t Scheduler::UncachedTokens(const Sequence& seq) const {
  int32_t scored_pool = 0;
  const absl::StatusOr<AdmissionPlan> plan =
      cache_->PlanAdmission(AdmissionFor(seq, &scored_pool));
  // Out of room (or refused): its admission computes nothing this step, and setting its
  // prompt aside could keep the budget from the running prefill whose end frees the room.
  if (!plan.ok() || !LeavesHeadroom(*plan)) return 0;
  if (plan->pending_match_tokens > 0) return 0;
  return Len(seq) - plan->num_cached;
}

bool Scheduler::LeavesHeadroom(const AdmissionPlan& plan) const {
  if (running_.empty()) return true;
  const int32_t bs = cache_->block_size();
  const int64_t left =
      cache_->NumAvailableBlocks() - plan.blocks_to_allocate - (plan.num_cached + bs - 1) / bs;
  return left >= static_cast<int64_t>(running_.size());
}

std::vector<std::pair<std::string, TenantCacheStats>> Scheduler::TenantStats() const {
  const absl::flat_hash_map<TenantId, TenantCacheStats> by_id = cache_->TenantStats();
  std::vector<std::pair<std::string, TenantCacheStats>> out;
  for (size_t id = 0; id < tenants_.size(); ++id) {
    auto it = by_id.find(static_cast<TenantId>(id));
    out.emplace_back(tenants_.Name(static_cast<TenantId>(id)),
                     it == by_id.end() ? TenantCacheStats() : it->second);
  }
  return out;
}

bool Scheduler::Step() {
  if (running_.empty() && waiting_.empty()) return false;
  // Retentions run on the wall clock: those past their time become normal cached blocks.
  cache_->ExpireRetention(NowMillis());
  SortRunning();
  std::vector<Scheduled> batch;

  // 1 + 2: decodes always run; prefill chunks share what they leave of the budget.
  int32_t decodes = 0;
  for (Sequence* seq : running_) {
    if (Len(*seq) - cache_->NumComputed(seq->cache_seq) == 1) ++decodes;
  }
  int32_t budget = std::max(0, options_.max_batch_tokens - decodes);
  // Which prefilling sequences get how much, by tenant (PlanChunks); reserved in admission
  // order all the same.
  const std::vector<int32_t> chunks = PlanChunks(budget);
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* seq = running_[i];
    const int32_t computed = cache_->NumComputed(seq->cache_seq);
    const int32_t uncomputed = Len(*seq) - computed;
    PREFIXD_CHECK(uncomputed >= 1);
    const int32_t count = uncomputed == 1 ? 1 : chunks[i];
    PREFIXD_CHECK(count <= std::max(budget, 1));
    if (count == 0) continue;
    // Preemption takes the newest, i.e. running_.back(): never one already in the batch.
    if (!ReserveOrPreempt(seq, computed + count)) break;
    if (uncomputed > 1) {
      budget -= count;
      fair_.Charge(TenantOf(seq), count);
    }
    batch.push_back({seq, computed, count, seq->decoding});
  }

  // 3: admissions.
  Admit(&batch, &budget);
  if (batch.empty()) {
    Prune();
    return false;
  }
  for (Scheduled& s : batch) s.all_logits = !s.decode && scorer_.Scoring(s.seq->request);

  if (!pending_copies_.empty()) {
    const absl::Status copied = backend_->CopyBlocks(pending_copies_);
    pending_copies_.clear();
    if (!copied.ok()) {
      FailRunning(copied);
      Prune();
      return true;
    }
  }
  // After the copies: a block an earlier copy reads may have been evicted and handed to an
  // admission as a load destination since.
  if (!pending_writes_.empty()) {
    const absl::Status written = RunTierWrites(batch);
    if (!written.ok()) {
      FailRunning(written);
      Prune();
      return true;
    }
  }
  // Block tables are read only now: every reservation, admission and preemption of this step
  // has happened, and nothing changes the cache until Forward returns.
  std::vector<SequenceStep> steps;
  steps.reserve(batch.size());
  for (const Scheduled& s : batch) {
    SequenceStep step;
    step.token_ids = s.seq->chain->tokens().subspan(s.start, s.count);
    step.start_pos = s.start;
    step.block_table = cache_->BlockTable(s.seq->cache_seq);
    step.want_all_logits = s.all_logits;
    step.want_logits = !s.all_logits && s.start + s.count == Len(*s.seq);
    step.adapter = s.seq->request->request.adapter.get();
    steps.push_back(step);
  }
  // Timed only for the offloader (its cap on waiting for a tier's load).
  const absl::Time forward_start =
      options_.offloader != nullptr ? options_.clock() : absl::InfinitePast();
  logits_.clear();
  const absl::Status forward = backend_->Forward(steps, &logits_);
  if (!forward.ok()) {
    FailRunning(forward);
    Prune();
    return true;
  }
  ++counters_.steps;
  const absl::Time now = options_.clock();
  if (options_.offloader != nullptr) {
    int64_t prefill = 0, tokens = 0;
    for (const Scheduled& s : batch) {
      tokens += s.count;
      if (!s.decode) prefill += s.count;
    }
    options_.offloader->ObserveForward(prefill, tokens, now - forward_start);
  }
  const size_t vocab = static_cast<size_t>(options_.model_config.vocab_size);
  size_t row = 0;
  for (const Scheduled& s : batch) {
    cache_->MarkComputed(s.seq->cache_seq, s.start + s.count);
    if (!s.decode) counters_.prefill_tokens += s.count;
    const bool ends = s.start + s.count == Len(*s.seq);
    const size_t rows = s.all_logits ? static_cast<size_t>(s.count) : ends ? 1 : 0;
    PREFIXD_CHECK((row + rows) * vocab <= logits_.size());
    if (s.all_logits) {
      scorer_.ScoreRows(s.seq->request, s.seq->chain->keys(), s.start, s.count,
                        absl::MakeConstSpan(logits_).subspan(row * vocab, rows * vocab));
    }
    // After ScoreRows: the blocks it recorded are published with their scores.
    if (options_.offloader != nullptr) {
      options_.offloader->OfferComputed(*s.seq->chain, cache_->BlockTable(s.seq->cache_seq),
                                        s.start, s.count);
    }
    row += rows;
    if (!ends) continue;
    // Forks join running_ (sorted again at the next step).
    output_.Emit(s.seq, absl::MakeConstSpan(logits_).subspan((row - 1) * vocab, vocab), now,
                 &running_);
  }
  Prune();
  return true;
}

void Scheduler::Admit(std::vector<Scheduled>* batch, int32_t* budget) {
  // The tiers' match answers are waited for this long in all, then the sequences whose
  // answer has not come stay parked until it wakes the engine.
  const absl::Time match_deadline = absl::Now() + KvOffloader::kMatchWait;
  // Each tenant's waiting sequences in queue order; the tenants take turns by FairShare.
  struct Queue {
    const std::string* tenant = nullptr;
    std::vector<Sequence*> seqs;
    size_t next = 0;
  };
  std::vector<Queue> queues;
  absl::flat_hash_map<TenantId, size_t> by_tenant;
  for (Sequence* seq : waiting_) {
    auto [it, fresh] = by_tenant.try_emplace(seq->request->tenant_id, queues.size());
    if (fresh) queues.emplace_back().tenant = &TenantOf(seq);
    queues[it->second].seqs.push_back(seq);
  }
  std::vector<FairShare::Candidate> candidates;
  std::vector<size_t> owner;
  while (*budget > 0) {
    candidates.clear();
    owner.clear();
    for (size_t q = 0; q < queues.size(); ++q) {
      const Queue& queue = queues[q];
      if (queue.next == queue.seqs.size()) continue;
      candidates.push_back({queue.tenant, arrival_.at(queue.seqs[queue.next]->request)});
      owner.push_back(q);
    }
    if (candidates.empty()) break;
    Queue& queue = queues[owner[fair_.Pick(candidates)]];
    Sequence* seq = queue.seqs[queue.next++];
    int32_t count = 0;
    const AdmitOutcome outcome = AdmitOne(seq, match_deadline, batch, budget, &count);
    if (outcome == kNoRoom) break;
    if (outcome == kAdmitted) fair_.Charge(*queue.tenant, count);
  }
  // Admitted (running) and ended (finished) ones leave the queue; the rest keep their order.
  waiting_.erase(
      std::remove_if(waiting_.begin(), waiting_.end(),
                     [](const Sequence* s) { return s->state != Sequence::State::kWaiting; }),
      waiting_.end());
}

Scheduler::AdmitOutcome Scheduler::AdmitOne(Sequence* seq, absl::Time match_deadline,
                                            std::vector<Scheduled>* batch, int32_t* budget,
                                            int32_t* count) {
  const int32_t bs = cache_->block_size();
  RequestState* r = seq->request;
  const bool scoring = scorer_.Scoring(r);
  int32_t scored_pool = 0;
  const AdmissionRequest ar = AdmissionFor(*seq, &scored_pool);
  absl::StatusOr<AdmissionPlan> plan = cache_->PlanAdmission(ar);
  // Another running sequence is computing blocks of this prefix: wait for them to be
  // indexed instead of computing them twice.
  if (plan.ok() && plan->pending_match_tokens > 0) return kSkipped;
  const int32_t pool_blocks = scoring ? scored_pool : plan.ok() ? plan->matched_tokens / bs : 0;
  std::shared_ptr<const TierLoad> load;
  int32_t tier_blocks = 0;
  if (plan.ok() && options_.offloader != nullptr) {
    KvOffloader::TierLookup c = options_.offloader->LookUpTiers(*seq->chain, pool_blocks, scoring,
                                                                match_deadline, &seq->tiers);
    if (c.parked) return kSkipped;  // its blocks are being loaded
    if (c.ready_blocks > 0) {
      // The loaded blocks fill whole blocks after the pool's whole blocks: no partial copy
      // into the first of them, and a scoring request shares its scored blocks whole (the
      // last loaded block's last row is recomputed instead).
      AdmissionRequest whole = ar;
      whole.whole_blocks_only = true;
      if (scoring) whole.max_cached_tokens = scored_pool * bs;
      absl::StatusOr<AdmissionPlan> p = cache_->PlanAdmission(whole);
      if (p.ok() && p->pending_match_tokens == 0 && p->num_cached == pool_blocks * bs) {
        plan = std::move(p);
        tier_blocks = c.ready_blocks;
        load = std::move(c.load);
      }
      // Otherwise the pool serves less than its match promised: computed as without tiers.
    }
  }
  if (!plan.ok()) {
    if (absl::IsResourceExhausted(plan.status())) return kNoRoom;  // in order: wait for room
    output_.EndRequest(r, absl::InternalError(plan.status().message()));
    return kEnded;
  }
  if (!LeavesHeadroom(*plan)) return kNoRoom;
  // With loaded blocks after them, the pool's blocks are shared whole; their records score
  // positions up to the last block's end, the loaded blocks' records the rest. Taken before
  // the Commit: when the partial copy did not fit, the admission ends at a block boundary and
  // the next block's record scores its first position, but that block is not held, so the
  // Commit's evictions may take it, and its record with it.
  if (scoring) {
    scorer_.TakeRecorded(r, seq->chain->keys(),
                         tier_blocks > 0 ? pool_blocks * bs - 1 : plan->num_cached);
  }
  Admission admission = cache_->Commit(*plan);
  pending_copies_.insert(pending_copies_.end(), admission.copies.begin(), admission.copies.end());
  seq->cache_seq = admission.seq;
  seq->state = Sequence::State::kRunning;
  seq->admit_order = next_admit_order_++;
  seq->decoding = false;
  int32_t start = admission.num_cached;
  if (tier_blocks > 0) {
    PREFIXD_CHECK(admission.num_cached == pool_blocks * bs);
    const int32_t end = pool_blocks + tier_blocks;
    // A scoring request recomputes the last loaded row: its logits score the next position.
    start = scoring ? end * bs - 1 : std::min(end * bs, Len(*seq) - 1);
    pending_writes_.push_back(
        {seq, pool_blocks, tier_blocks, !r->admitted_once, scoring, std::move(load)});
  }
  // Taken (its budget returns once the write has run).
  if (seq->tiers != nullptr) seq->tiers->load.reset();
  if (!r->admitted_once) {
    r->admitted_once = true;
    r->usage.cached_prompt_tokens = static_cast<uint32_t>(admission.num_cached);
    r->usage.cached_retained_tokens = static_cast<uint32_t>(admission.retained_tokens);
    // Where the pool counts queried_tokens and hit_tokens (a first admission's Commit).
    PromptTokenCounts& counts = adapter_tokens_[r->request.adapter_name];
    counts.queried_tokens += static_cast<uint64_t>(seq->chain->size());
    counts.hit_tokens += static_cast<uint64_t>(admission.num_cached);
  }
  running_.push_back(seq);  // the newest: running_ stays sorted
  *count = std::min(Len(*seq) - start, *budget);
  *budget -= *count;
  batch->push_back({seq, start, *count, false});
  return kAdmitted;
}

absl::Status Scheduler::RunTierWrites(const std::vector<Scheduled>& batch) {
  const int32_t bs = cache_->block_size();
  std::vector<TierWrite> writes;
  writes.swap(pending_writes_);
  for (const TierWrite& w : writes) {
    Sequence* seq = w.seq;
    RequestState* r = seq->request;
    auto entry = std::find_if(batch.begin(), batch.end(),
                              [seq](const Scheduled& s) { return s.seq == seq; });
    PREFIXD_CHECK(entry != batch.end());
    absl::StatusOr<std::vector<KvOffloader::WrittenBlock>> written = options_.offloader->Write(
        *w.load, w.first_block, w.count, cache_->BlockTable(seq->cache_seq));
    if (!written.ok()) return written.status();
    for (const KvOffloader::WrittenBlock& b : *written) {
      (b.medium == TierMedium::kDisk ? disk_load_ : remote_load_).push_back(b.seconds);
    }
    const int32_t pool_cached = w.first_block * bs;
    const int32_t end = w.first_block + w.count;
    const int32_t cached = w.scoring ? end * bs - 1 : std::min(end * bs, Len(*seq) - 1);
    PREFIXD_CHECK(cached == entry->start);
    cache_->MarkComputed(seq->cache_seq, cached);
    // After MarkComputed: a record enters the store only once its block is indexed.
    PREFIXD_CHECK(written->size() == static_cast<size_t>(w.count));
    std::vector<std::shared_ptr<const BlockScores>> records;
    records.reserve(written->size());
    for (const KvOffloader::WrittenBlock& b : *written) records.push_back(b.record);
    scorer_.RestoreLoaded(w.scoring ? r : nullptr, seq->chain->keys(), w.first_block, records,
                          cached);
    if (w.first_admission) {
      r->usage.cached_prompt_tokens += static_cast<uint32_t>(cached - pool_cached);
      // Each block's tokens of the cached ones (the last block's may be recomputed in
      // part), counted by the medium it came from.
      for (int32_t i = 0; i < w.count; ++i) {
        const int32_t b = w.first_block + i;
        const int32_t tokens = std::max(std::min(cached, (b + 1) * bs) - b * bs, 0);
        const bool disk = (*written)[i].medium == TierMedium::kDisk;
        (disk ? counters_.disk_hit_tokens : counters_.remote_hit_tokens) +=
            static_cast<uint64_t>(tokens);
        (disk ? r->usage.cached_disk_tokens : r->usage.cached_remote_tokens) +=
            static_cast<uint32_t>(tokens);
      }
      adapter_tokens_[r->request.adapter_name].hit_tokens +=
          static_cast<uint64_t>(cached - pool_cached);
    }
  }
  return absl::OkStatus();
}

bool Scheduler::ReserveOrPreempt(Sequence* seq, int32_t total_tokens) {
  while (true) {
    absl::StatusOr<std::vector<BlockCopy>> copies = cache_->Reserve(seq->cache_seq, total_tokens);
    if (copies.ok()) {
      pending_copies_.insert(pending_copies_.end(), copies->begin(), copies->end());
      return true;
    }
    PREFIXD_CHECK_MSG(absl::IsResourceExhausted(copies.status()),
                      std::string(copies.status().message()).c_str());
    Sequence* victim = running_.back();
    if (victim == seq && running_.size() == 1) {
      // Validation admits only requests that fit the pool alone; reaching this is a bug,
      // but ending one request beats spinning forever.
      output_.EndRequest(
          seq->request,
          absl::InternalError(absl::StrFormat(
              "the KV pool cannot hold this sequence (%d tokens) even alone", total_tokens)));
      return false;
    }
    Preempt(victim);
    if (victim == seq) return false;
  }
}

void Scheduler::Preempt(Sequence* seq) {
  PREFIXD_CHECK(seq->state == Sequence::State::kRunning);
  cache_->Release(seq->cache_seq);  // full computed blocks stay indexed: resumes cheaply
  seq->cache_seq = -1;
  seq->state = Sequence::State::kWaiting;
  seq->decoding = false;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  ++counters_.preemptions;
}

void Scheduler::FailRunning(const absl::Status& status) {
  pending_copies_.clear();
  pending_writes_.clear();
  if (IsFatalDeviceError(status) && fatal_error_.ok()) fatal_error_ = status;
  const absl::Status error =
      absl::InternalError(absl::StrCat("backend failure: ", status.message()));
  std::vector<RequestState*> failed;
  for (Sequence* seq : running_) failed.push_back(seq->request);
  for (RequestState* r : failed) {
    if (!r->ended) output_.EndRequest(r, error);
  }
}

void Scheduler::Prune() {
  auto finished = [](const Sequence* s) { return s->state == Sequence::State::kFinished; };
  running_.erase(std::remove_if(running_.begin(), running_.end(), finished), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), finished), waiting_.end());
  UpdateCounts();
}

void Scheduler::FlushEvents() {
  Prune();
  for (auto& r : requests_) {
    if (!r->outbox.empty()) {
      r->stream->Push(std::move(r->outbox));
      r->outbox.clear();
    }
  }
  for (const auto& r : requests_) {
    if (!r->ended) continue;
    scorer_.Forget(r.get());  // one that ended before its prompt was scored
    arrival_.erase(r.get());
  }
  requests_.erase(
      std::remove_if(requests_.begin(), requests_.end(), [](const auto& r) { return r->ended; }),
      requests_.end());
  UpdateCounts();
}

void Scheduler::UpdateCounts() {
  counters_.waiting_requests = 0;
  counters_.running_requests = 0;
  for (const auto& r : requests_) {
    if (r->ended) continue;
    bool running = false;
    for (const auto& s : r->sequences) running |= s->state == Sequence::State::kRunning;
    ++(running ? counters_.running_requests : counters_.waiting_requests);
  }
}

}  // namespace prefixd
