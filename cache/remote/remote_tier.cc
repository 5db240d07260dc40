#include "cache/remote/remote_tier.h"

#include <hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "base/check.h"
#include "cache/remote/redis_connection.h"
#include "cache/sha256.h"

namespace prefixd {

std::string RemoteEndpoint::ToString() const {
  if (!unix_path.empty()) return absl::StrCat("unix://", unix_path);
  const std::string h = absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host;
  return absl::StrCat("redis://", h, ":", port, "/", db);
}

absl::StatusOr<RemoteEndpoint> ParseRemoteUrl(const std::string& url) {
  RemoteEndpoint e;
  absl::string_view rest(url);
  auto bad = [&url](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-remote \"", url, "\": ", why,
        " (expected redis://HOST:PORT[/DB] or unix:///path/to/redis.sock)"));
  };
  if (absl::ConsumePrefix(&rest, "unix://")) {
    if (rest.empty() || rest.front() != '/') return bad("the socket path must be absolute");
    e.unix_path = std::string(rest);
    return e;
  }
  if (!absl::ConsumePrefix(&rest, "redis://")) {
    if (absl::StartsWith(url, "rediss://")) return bad("TLS to Redis (rediss://) is not supported");
    return bad("unknown scheme");
  }
  if (rest.find('@') != absl::string_view::npos) {
    return bad("a user or password in the URL would show in the process list; put the "
               "password in --kv-remote-password-file");
  }
  absl::string_view hostport = rest;
  const size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    hostport = rest.substr(0, slash);
    const absl::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!absl::SimpleAtoi(db, &e.db) || e.db < 0 || e.db > 1000000)) {
      return bad(absl::StrCat("bad database number \"", db, "\""));
    }
  }
  absl::string_view port;
  if (absl::ConsumePrefix(&hostport, "[")) {
    const size_t close = hostport.find(']');
    if (close == absl::string_view::npos) return bad("unclosed [ in the host");
    e.host = std::string(hostport.substr(0, close));
    hostport.remove_prefix(close + 1);
    if (!absl::ConsumePrefix(&hostport, ":")) return bad("missing :PORT");
    port = hostport;
  } else {
    const size_t colon = hostport.rfind(':');
    if (colon == absl::string_view::npos) return bad("missing :PORT");
    e.host = std::string(hostport.substr(0, colon));
    port = hostport.substr(colon + 1);
  }
  if (e.host.empty()) return bad("missing host");
  if (!absl::SimpleAtoi(port, &e.port) || e.port <= 0 || e.port > 65535) {
    return bad(absl::StrCat("bad port \"", port, "\""));
  }
  return e;
}


absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options,
                                                             const BlockLayout& layout) {
  absl::StatusOr<RemoteEndpoint> endpoint = ParseRemoteUrl(options.url);
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status s = ValidateBlockLayout(layout); !s.ok()) return s;
  if (options.timeout <= absl::ZeroDuration() || options.timeout > kMaxRemoteTierTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-remote-timeout must be above 0 and at most ",
                     absl::FormatDuration(kMaxRemoteTierTimeout), ", got ",
                     absl::FormatDuration(options.timeout)));
  }
  if (options.fetch_timeout < absl::ZeroDuration() ||
      options.fetch_timeout > kMaxRemoteTierTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("the remote tier's fetch_timeout must be 0 (the command timeout) to ",
                     absl::FormatDuration(kMaxRemoteTierTimeout), ", got ",
                     absl::FormatDuration(options.fetch_timeout)));
  }
  if (options.match_timeout < absl::ZeroDuration() ||
      options.match_timeout > kMaxRemoteTierTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("the remote tier's match_timeout must be 0 (twice the command timeout) to ",
                     absl::FormatDuration(kMaxRemoteTierTimeout), ", got ",
                     absl::FormatDuration(options.match_timeout)));
  }
  if (options.backoff_min <= absl::ZeroDuration() || options.backoff_max < options.backoff_min) {
    return absl::InvalidArgumentError("the remote tier needs 0 < backoff_min <= backoff_max");
  }
  if (options.max_queued_blocks <= 0 || options.max_match_blocks <= 0 ||
      options.max_fetch_blocks <= 0) {
    return absl::InvalidArgumentError(
        "the remote tier's max_queued_blocks, max_match_blocks and max_fetch_blocks must be "
        "positive");
  }
  if (options.key_prefix.size() > 256 ||
      std::any_of(options.key_prefix.begin(), options.key_prefix.end(),
                  [](unsigned char c) { return c <= ' ' || c >= 0x7f; })) {
    return absl::InvalidArgumentError(
        "--kv-remote-prefix must be at most 256 printable characters without spaces");
  }
  return std::unique_ptr<RemoteTier>(new RemoteTier(options, *endpoint, layout));
}

RemoteTier::RemoteTier(const RemoteTierOptions& options, const RemoteEndpoint& endpoint,
                       const BlockLayout& layout)
    : options_(options), endpoint_(endpoint), layout_(layout), layout_id_(layout.Id()) {
  matcher_conn_ = std::make_unique<RedisConnection>(endpoint_, options_);
  publisher_conn_ = std::make_unique<RedisConnection>(endpoint_, options_);
  fetcher_conn_ = std::make_unique<RedisConnection>(endpoint_, options_);
  stats_.configured = true;
  fetch_wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  PREFIXD_CHECK(fetch_wake_fd_ >= 0);
  publisher_ = std::thread([this] { PublisherLoop(); });
  fetcher_ = std::thread([this] { FetcherLoop(); });
  matcher_ = std::thread([this] { MatcherLoop(); });
}

RemoteTier::~RemoteTier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    stats_.stores_dropped += queue_.size();
    queue_.clear();
  }
  publisher_.join();
  fetcher_.join();  // it ends the fetches still queued (nothing fetched) first
  matcher_.join();  // likewise the matches (answered 0)
  close(fetch_wake_fd_);
}

std::string RemoteTier::KeyOf(const Digest& key) const {
  return absl::StrCat(options_.key_prefix, layout_id_, ":", DigestHex(key));
}

void RemoteTier::CountError(uint64_t RemoteTierStats::*counter, const std::string& what) {
  {
    absl::MutexLock lock(&mu_);
    ++(stats_.*counter);
    stats_.up = false;
  }
  if (options_.log) options_.log(absl::StrCat("remote cache tier: ", what));
}

absl::StatusOr<std::shared_ptr<const TierMatch>> RemoteTier::StartMatch(
    absl::Span<const Digest> keys, const MatchOptions& match, std::function<void()> on_done) {
  PREFIXD_CHECK(!keys.empty());
  if (!matcher_conn_->ready()) return absl::UnavailableError("the remote tier is backing off");
  auto m = std::make_shared<TierMatch>();
  const size_t n = std::min(keys.size(), static_cast<size_t>(options_.max_match_blocks));
  m->keys.assign(keys.begin(), keys.begin() + n);
  m->scored_only = match.scored_only;
  m->deadline = absl::Now() + MatchTimeout(options_);
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("the remote tier is shutting down");
  matches_.push_back({m, std::move(on_done)});
  return m;
}

size_t RemoteTier::MatchFrom(absl::Span<const Digest> keys, const MatchOptions& match) {
  if (keys.empty()) return 0;
  absl::StatusOr<std::shared_ptr<const TierMatch>> m = StartMatch(keys, match, nullptr);
  if (!m.ok()) return 0;
  (*m)->done_.WaitForNotification();
  return (*m)->blocks;
}

void RemoteTier::MatcherLoop() {
  while (true) {
    std::vector<PendingMatch> batch;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !matches_.empty() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (matches_.empty()) return;  // stop_, nothing left
      // Every match queued meanwhile goes in the same round trip.
      batch.assign(std::make_move_iterator(matches_.begin()),
                   std::make_move_iterator(matches_.end()));
      matches_.clear();
      stopping = stop_;
    }
    // While stopping, each is answered 0 at once; so is one whose deadline passed while it
    // waited behind an earlier round trip (a miss: its blocks are computed).
    if (!stopping) {
      const absl::Time now = absl::Now();
      auto expired = std::partition(batch.begin(), batch.end(), [now](const PendingMatch& p) {
        return p.match->deadline > now;
      });
      if (expired != batch.end()) {
        absl::MutexLock lock(&mu_);
        stats_.match_timeouts += static_cast<uint64_t>(batch.end() - expired);
      }
      AnswerMatches(absl::MakeConstSpan(batch.data(), expired - batch.begin()));
    }
    std::vector<std::function<void()>> wakes;
    for (PendingMatch& p : batch) {
      p.match->done_.Notify();
      wakes.push_back(std::move(p.on_done));
    }
    // This thread lets go first, so that whoever a wake reaches holds the only reference.
    batch.clear();
    for (std::function<void()>& wake : wakes) {
      if (wake) wake();
    }
  }
}

void RemoteTier::AnswerMatches(absl::Span<const PendingMatch> batch) {
  if (batch.empty()) return;
  RedisConnection& c = *matcher_conn_;
  if (!c.ready()) return;  // backing off since StartMatch: answered 0
  // The round trip ends by the earliest deadline of the batch: a match not answered by its
  // deadline is a miss, whatever the command timeout.
  absl::Time deadline = absl::InfiniteFuture();
  for (const PendingMatch& p : batch) deadline = std::min(deadline, p.match->deadline);
  c.SetDeadline(deadline, MatchTimeout(options_));
  struct Unbound {
    RedisConnection& c;
    ~Unbound() { c.SetDeadline(absl::InfiniteFuture(), absl::ZeroDuration()); }
  } unbound{c};
  // A failure is a fault (counted by its operation); one of the deadline also leaves every
  // match of the batch unanswered in time.
  auto failed = [&](uint64_t RemoteTierStats::*counter, const absl::Status& s) {
    CountError(counter, std::string(s.message()));
    if (!c.deadline_passed()) return;
    absl::MutexLock lock(&mu_);
    stats_.match_timeouts += batch.size();
  };
  if (absl::Status s = c.Ensure(); !s.ok()) {
    failed(&RemoteTierStats::connect_errors, s);
    return;
  }
  for (const PendingMatch& p : batch) {
    const TierMatch* m = p.match.get();
    for (const Digest& key : m->keys) {
      const std::string name = KeyOf(key);
      // STRLEN tells a value with a score section by its size (0 for an absent key).
      const char* argv[] = {m->scored_only ? "STRLEN" : "EXISTS", name.data()};
      const size_t lens[] = {6, name.size()};
      if (absl::Status s = c.Append(2, argv, lens); !s.ok()) {
        failed(&RemoteTierStats::match_errors, s);
        return;
      }
    }
  }
  // Every reply is read, so that the pipeline ends empty; a failure closes the connection,
  // and the matches not yet answered stay at 0.
  for (const PendingMatch& p : batch) {
    TierMatch* m = p.match.get();
    size_t matched = 0;
    bool prefix = true;
    for (size_t i = 0; i < m->keys.size(); ++i) {
      // A value of another type under the key (STRLEN's WRONGTYPE) is no match.
      absl::StatusOr<Reply> r = c.GetReply(/*wrong_type_ok=*/m->scored_only);
      if (!r.ok()) {
        failed(&RemoteTierStats::match_errors, r.status());
        return;
      }
      const long long want = m->scored_only ? layout_.scored_record_bytes() : 1;
      prefix = prefix && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == want &&
               !(m->scored_only && layout_.score_top_k == 0);
      if (prefix) ++matched;
    }
    m->blocks = matched;
  }
  c.Succeeded();
  absl::MutexLock lock(&mu_);
  stats_.up = true;
}

absl::StatusOr<std::shared_ptr<const TierFetch>> RemoteTier::Fetch(const Digest& root,
                                                                   std::vector<Digest> keys,
                                                                   std::vector<uint32_t> tokens,
                                                                   std::function<void()> on_done) {
  PREFIXD_CHECK(tokens.size() == keys.size() * layout_.block_size);
  const int64_t n = static_cast<int64_t>(keys.size());
  PREFIXD_CHECK(n > 0 && n <= options_.max_fetch_blocks);
  if (!fetcher_conn_->ready()) return absl::UnavailableError("the remote tier is backing off");
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("the remote tier is shutting down");
  if (fetch_blocks_in_flight_ + n > options_.max_fetch_blocks) {
    return absl::ResourceExhaustedError("the remote tier's fetch budget is in use");
  }
  fetch_blocks_in_flight_ += n;
  // The budget comes back when the last holder (the request, or the fetcher) lets go. The
  // tier outlives every fetch: the engine's scheduler holds them and goes first, and the
  // fetcher thread drops its own before the tier's members go.
  // Its block buffers are kept for the next fetches (at most the budget's worth): a fresh
  // 1.2 MB buffer costs its page faults on every use, more than the GET and the SHA-256
  // together on a virtual machine (docs/BENCHMARKS.md, "Remote cache tier").
  std::shared_ptr<TierFetch> f(new TierFetch, [this, n](TierFetch* done) {
    std::vector<std::vector<uint8_t>> buffers = std::move(done->values);
    delete done;
    absl::MutexLock l(&mu_);
    fetch_blocks_in_flight_ -= n;
    for (std::vector<uint8_t>& b : buffers) GiveBackLocked(std::move(b));
  });
  f->root = root;
  f->deadline = absl::Now() + FetchTimeout(options_);
  f->keys = std::move(keys);
  f->tokens = std::move(tokens);
  fetches_.push_back({f, std::move(on_done)});
  const uint64_t one = 1;
  // Never blocks (non-blocking; a full counter already wakes the fetcher).
  [[maybe_unused]] const ssize_t w = write(fetch_wake_fd_, &one, sizeof(one));
  return f;
}

void RemoteTier::FetcherLoop() {
  RedisConnection& c = *fetcher_conn_;
  // Fetches whose commands went out, in order: their replies come in that order.
  std::deque<PendingFetch> sent;
  // A fetch that found a corrupt value ends once the value is deleted: a DEL sent when
  // every reply sent for has been read (so that the pipeline stays in step), within that
  // fetch's deadline.
  struct Ended {
    PendingFetch p;
    uint64_t loads, corrupt;
  };
  std::vector<Ended> after_delete;
  std::vector<std::string> corrupt_names;
  while (true) {
    if (sent.empty() && !TakeAndSend(&sent, /*wait=*/true)) return;
    if (sent.empty()) continue;
    PendingFetch p = std::move(sent.front());
    sent.pop_front();
    uint64_t loads = 0, corrupt = 0;
    if (c.connected()) {
      c.SetDeadline(p.fetch->deadline, FetchTimeout(options_));
      // Fetches queued while this one waits for its replies go out at once (after it).
      c.SetWaitHook(fetch_wake_fd_, [this, &sent] { TakeAndSend(&sent, /*wait=*/false); });
      ReceiveFetch(*p.fetch, &loads, &corrupt, &corrupt_names);
      c.SetWaitHook(-1, nullptr);
    }
    if (corrupt > 0) {
      after_delete.push_back({std::move(p), loads, corrupt});
    } else {
      EndFetch(p, loads, corrupt);
    }
    if (!sent.empty() || after_delete.empty()) continue;
    c.SetDeadline(after_delete.front().p.fetch->deadline, FetchTimeout(options_));
    for (const std::string& name : corrupt_names) {
      if (!c.connected()) break;
      const char* del[] = {"DEL", name.data()};
      const size_t del_lens[] = {3, name.size()};
      if (!c.Run(2, del, del_lens).ok()) {
        CountError(&RemoteTierStats::load_errors, "cannot delete a corrupt value");
      }
    }
    corrupt_names.clear();
    for (Ended& e : after_delete) EndFetch(e.p, e.loads, e.corrupt);
    after_delete.clear();
  }
}

bool RemoteTier::TakeAndSend(std::deque<PendingFetch>* sent, bool wait) {
  std::vector<PendingFetch> batch;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !fetches_.empty() || stop_; };
    if (wait) mu_.Await(absl::Condition(&ready));
    if (wait && fetches_.empty()) return false;  // stop_, nothing left
    batch.assign(std::make_move_iterator(fetches_.begin()),
                 std::make_move_iterator(fetches_.end()));
    fetches_.clear();
    stopping = stop_;
  }
  RedisConnection& c = *fetcher_conn_;
  for (PendingFetch& p : batch) {
    // While stopping, each fetch ends with nothing, and quickly; so does one whose deadline
    // passed while it waited (its blocks are computed).
    if (stopping || p.fetch->deadline <= absl::Now()) {
      EndFetch(p, 0, 0);
      continue;
    }
    if (!c.connected()) {  // (never while the hook runs: that reads from the connection)
      c.SetDeadline(p.fetch->deadline, FetchTimeout(options_));
      absl::Status s = c.ready() ? c.Ensure() : absl::UnavailableError("backing off");
      if (!s.ok()) {
        CountError(&RemoteTierStats::connect_errors, std::string(s.message()));
        EndFetch(p, 0, 0);
        continue;
      }
    }
    if (!SendFetch(*p.fetch)) {
      EndFetch(p, 0, 0);
      continue;
    }
    sent->push_back(std::move(p));
  }
  return true;
}

void RemoteTier::EndFetch(PendingFetch& p, uint64_t loads, uint64_t corrupt) {
  TierFetch& f = *p.fetch;
  {
    absl::MutexLock lock(&mu_);
    stats_.loads += loads;
    stats_.corrupt_blocks += corrupt;
    if (loads > 0) stats_.up = true;
    for (size_t i = 0; i < f.data.size(); ++i) RememberLocked(f.keys[i], !f.scores[i].empty());
  }
  f.done_.store(true, std::memory_order_release);
  // This thread lets go first (outside mu_: the fetch's deleter takes it), so that whoever
  // on_done wakes holds the only reference.
  std::function<void()> on_done = std::move(p.on_done);
  p = PendingFetch();
  if (on_done) on_done();
}

bool RemoteTier::SendFetch(const TierFetch& f) {
  RedisConnection& c = *fetcher_conn_;
  const size_t n = f.keys.size();
  const std::string max_record_end = absl::StrCat(
      (layout_.score_top_k > 0 ? layout_.scored_record_bytes() : layout_.record_bytes()) - 1);
  // Every block's commands go out at once, so the whole fetch is one round trip: a server
  // slow to answer costs its delay once, not once per block (16 blocks from a Redis 200 ms
  // late took 3.2 s one GET at a time). A record's size is fixed by the layout, so each block
  // is STRLEN and a GETRANGE of at most one record: a value of another length (junk planted
  // under a key) is refused without being read, and neither hiredis's read buffer nor a
  // fetch buffer grows past one record.
  for (size_t i = 0; i < n; ++i) {
    if (options_.fetch_hook) options_.fetch_hook();
    const std::string name = KeyOf(f.keys[i]);
    const char* strlen_argv[] = {"STRLEN", name.data()};
    const size_t strlen_lens[] = {6, name.size()};
    const char* range_argv[] = {"GETRANGE", name.data(), "0", max_record_end.data()};
    const size_t range_lens[] = {8, name.size(), 1, max_record_end.size()};
    absl::Status sent = c.Append(2, strlen_argv, strlen_lens);
    if (sent.ok()) sent = c.Append(4, range_argv, range_lens);
    if (!sent.ok()) {
      CountError(&RemoteTierStats::load_errors, std::string(sent.message()));
      return false;
    }
  }
  return true;
}

bool RemoteTier::ReceiveFetch(TierFetch& f, uint64_t* loads, uint64_t* corrupt,
                              std::vector<std::string>* corrupt_names) {
  RedisConnection& c = *fetcher_conn_;
  const size_t bs = layout_.block_size;
  const size_t n = f.keys.size();
  // Values land in buffers of earlier fetches (no allocation once one held a block) and are
  // verified there; a block's K/V rows are a span of its value.
  auto take = [this] {
    absl::MutexLock lock(&mu_);
    return TakeBufferLocked();
  };
  auto spare = [this](std::vector<uint8_t> value) {  // a value not kept, for the next fetch
    absl::MutexLock lock(&mu_);
    GiveBackLocked(std::move(value));
  };
  // The fetch keeps the blocks before the first that is gone (evicted since the match),
  // fails verification or cannot be fetched. The replies after it are still read, so that
  // the connection's pipeline ends empty; a corrupt value is deleted after that.
  bool stopped = false;
  for (size_t i = 0; i < n; ++i) {
    const absl::Time t0 = absl::Now();
    std::vector<uint8_t> value = take();
    absl::StatusOr<Reply> length = c.GetReply(/*wrong_type_ok=*/true);  // sends the pipeline
    c.SinkStringsInto(&value);
    absl::StatusOr<Reply> r = length.ok() ? c.GetReply(/*wrong_type_ok=*/true) : length.status();
    const bool sunk = c.sunk();
    c.SinkStringsInto(nullptr);
    if (!r.ok()) {  // the connection is closed: nothing more to read
      spare(std::move(value));
      CountError(&RemoteTierStats::load_errors, std::string(r.status().message()));
      return false;
    }
    c.Succeeded();
    // STRLEN is 0 for a key evicted since the match (an empty value reads as absent too).
    if (stopped || ((*length)->type == REDIS_REPLY_INTEGER && (*length)->integer == 0)) {
      stopped = true;
      spare(std::move(value));
      continue;
    }
    const bool record_length =
        (*length)->type == REDIS_REPLY_INTEGER &&
        ((*length)->integer == layout_.record_bytes() ||
         (layout_.score_top_k > 0 && (*length)->integer == layout_.scored_record_bytes()));
    std::vector<PositionScore> section;
    const BlockExpectation expect{
        .root = f.root, .key = f.keys[i],
        .tokens = absl::MakeConstSpan(f.tokens).subspan(i * bs, bs)};
    absl::StatusOr<absl::Span<const uint8_t>> data =
        (*r)->type != REDIS_REPLY_STRING || !sunk
            ? absl::DataLossError("the remote value is not a string")
        : !record_length
            ? absl::DataLossError("the remote value's length is not a block record's")
            : DecodeBlockRecord(
                  std::string_view(reinterpret_cast<const char*>(value.data()), value.size()),
                  layout_, expect, &section);
    if (!data.ok()) {
      ++*corrupt;
      corrupt_names->push_back(KeyOf(f.keys[i]));
      stopped = true;
      spare(std::move(value));
      continue;
    }
    f.data.push_back(*data);  // moving the vector keeps its storage where the span points
    f.values.push_back(std::move(value));
    f.scores.push_back(std::move(section));
    f.seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    ++*loads;
  }
  return true;
}

std::vector<uint8_t> RemoteTier::TakeBufferLocked() {
  if (spare_buffers_.empty()) return {};
  std::vector<uint8_t> b = std::move(spare_buffers_.back());
  spare_buffers_.pop_back();
  return b;
}

void RemoteTier::GiveBackLocked(std::vector<uint8_t> buffer) {
  if (buffer.capacity() == 0) return;
  if (static_cast<int32_t>(spare_buffers_.size()) >= options_.max_fetch_blocks) return;
  spare_buffers_.push_back(std::move(buffer));
}

std::vector<uint8_t> RemoteTier::PublishBuffer() {
  std::vector<uint8_t> b;
  {
    absl::MutexLock lock(&mu_);
    b = TakeBufferLocked();
  }
  // A fresh one has room for a whole value, so that a fetch may take it after the publisher.
  if (b.capacity() == 0) b.reserve(static_cast<size_t>(layout_.scored_record_bytes()));
  b.resize(static_cast<size_t>(layout_.data_bytes()));
  return b;
}

bool RemoteTier::WantsPublish(const Digest& key, const PublishIntent& publish) {
  absl::MutexLock lock(&mu_);
  if (auto it = recent_.find(key); it != recent_.end() && (it->second.scored || !publish.scored)) {
    return false;
  }
  if (stop_ || !publisher_conn_->ready() ||
      static_cast<int32_t>(queue_.size()) >= options_.max_queued_blocks) {
    ++stats_.stores_dropped;
    return false;
  }
  return true;
}

void RemoteTier::Publish(BlockRecord record) {
  PREFIXD_CHECK(record.tokens.size() == layout_.block_size);
  PREFIXD_CHECK(static_cast<int64_t>(record.data.size()) == layout_.data_bytes());
  absl::MutexLock lock(&mu_);
  RememberLocked(record.key, !record.scores.empty());
  queue_.push_back(std::move(record));
}

void RemoteTier::RememberLocked(const Digest& key, bool scored) {
  auto [it, inserted] = recent_.try_emplace(key);
  if (!inserted) {
    it->second.scored = it->second.scored || scored;
    return;
  }
  it->second = {.scored = scored, .number = ++remembered_};
  recent_order_.emplace_back(key, remembered_);
  if (recent_order_.size() > kRememberedKeys) {
    // Only the entry the key was remembered under forgets it (not one a failed store left).
    const auto& [oldest, number] = recent_order_.front();
    if (auto o = recent_.find(oldest); o != recent_.end() && o->second.number == number) {
      recent_.erase(o);
    }
    recent_order_.pop_front();
  }
}

bool RemoteTier::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (queue_.empty() && !publishing_) || stop_;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline) && queue_.empty() &&
         !publishing_;
}

void RemoteTier::PublisherLoop() {
  while (true) {
    BlockRecord record;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      record = std::move(queue_.front());
      queue_.pop_front();
      publishing_ = true;
    }
    const std::string value = EncodeBlockRecord(layout_, record);
    const std::string name = KeyOf(record.key);
    RedisConnection& c = *publisher_conn_;
    absl::Status s = c.ready() ? c.Ensure() : absl::UnavailableError("backing off");
    bool stored = false;
    if (s.ok()) {
      const char* argv[] = {"SET", name.data(), value.data()};
      const size_t lens[] = {3, name.size(), value.size()};
      absl::StatusOr<Reply> r = c.Run(3, argv, lens);
      s = r.status();
      stored = r.ok();
      if (stored) c.Succeeded();
    }
    if (!stored) {
      // A full Redis (maxmemory with noeviction) answers an OOM error: counted as a store
      // error like any other. The key is forgotten so that a later computation offers it again.
      CountError(&RemoteTierStats::store_errors, std::string(s.message()));
    }
    absl::MutexLock lock(&mu_);
    GiveBackLocked(std::move(record.data));
    publishing_ = false;
    if (stored) {
      ++stats_.stores;
      stats_.up = true;
    } else {
      ++stats_.stores_dropped;
      // Forgotten (its place in recent_order_ is dropped lazily), unless a record with a
      // score section was accepted for the key since this one without: that one is queued,
      // and once it is stored an offer without scores must not overwrite it.
      auto it = recent_.find(record.key);
      if (it != recent_.end() && (!it->second.scored || !record.scores.empty())) {
        recent_.erase(it);
      }
    }
  }
}

RemoteTierStats RemoteTier::Stats() const {
  absl::MutexLock lock(&mu_);
  RemoteTierStats s = stats_;
  s.queued_blocks = static_cast<int64_t>(queue_.size());
  return s;
}

}  // namespace prefixd
