#include "cache/remote/remote_tier.h"

#include <hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
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
#include "cache/sha256.h"

namespace prefixd {
namespace {

// Keys published or queued that are remembered, so that a block is not sent twice.
constexpr size_t kRecentKeys = 1 << 16;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

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

// One hiredis connection with a timeout on every call and a backoff after every failure.
// Used by one thread; ready() may be read from any.
class RedisConnection {
 public:
  RedisConnection(const RemoteEndpoint& endpoint, const RemoteTierOptions& options)
      : endpoint_(endpoint), options_(options) {}
  ~RedisConnection() { Close(); }

  // False while backing off after a failure.
  bool ready() const { return absl::Now() >= absl::FromUnixNanos(retry_at_ns_.load()); }

  // Connects (and authenticates, selects the database) when not connected. Non-OK (with the
  // backoff started) on a failure.
  absl::Status Ensure() {
    if (ctx_ != nullptr) return absl::OkStatus();
    const timeval tv = absl::ToTimeval(options_.timeout);
    ctx_ = endpoint_.unix_path.empty()
               ? redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, tv)
               : redisConnectUnixWithTimeout(endpoint_.unix_path.c_str(), tv);
    if (ctx_ == nullptr) return Failed("cannot allocate a connection");
    if (ctx_->err != 0) return Failed(absl::StrCat("connect: ", ctx_->errstr));
    if (redisSetTimeout(ctx_, tv) != REDIS_OK) return Failed("cannot set the socket timeout");
    if (!options_.password.empty()) {
      const char* argv[] = {"AUTH", options_.password.data()};
      const size_t lens[] = {4, options_.password.size()};
      absl::StatusOr<Reply> r = Run(2, argv, lens);
      if (!r.ok()) return r.status();
    }
    if (endpoint_.db != 0) {
      const std::string db = absl::StrCat(endpoint_.db);
      const char* argv[] = {"SELECT", db.data()};
      const size_t lens[] = {6, db.size()};
      absl::StatusOr<Reply> r = Run(2, argv, lens);
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

  // One command; an error reply is a failure too (message from the server), except
  // WRONGTYPE when `wrong_type_ok`: a value that is not a string is the caller's to judge.
  absl::StatusOr<Reply> Run(int argc, const char** argv, const size_t* lens,
                            bool wrong_type_ok = false) {
    if (ctx_ == nullptr) return absl::UnavailableError("not connected");
    Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_, argc, argv, lens)));
    if (r == nullptr) return Failed(IoError());
    if (r->type == REDIS_REPLY_ERROR) {
      std::string text(r->str, r->len);
      if (wrong_type_ok && absl::StartsWith(text, "WRONGTYPE")) return r;
      return Failed(text);
    }
    return r;
  }

  // Appends a command to the pipeline (sent with the first GetReply).
  absl::Status Append(int argc, const char** argv, const size_t* lens) {
    if (redisAppendCommandArgv(ctx_, argc, argv, lens) != REDIS_OK) return Failed(IoError());
    return absl::OkStatus();
  }
  absl::StatusOr<Reply> GetReply() {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) return Failed(IoError());
    Reply r(static_cast<redisReply*>(raw));
    if (r->type == REDIS_REPLY_ERROR) return Failed(std::string(r->str, r->len));
    return r;
  }

  void Succeeded() { backoff_ = absl::ZeroDuration(); }

  // Closes the connection (its pipeline state is unknown) and starts or doubles the backoff.
  absl::Status Failed(const std::string& what) {
    Close();
    backoff_ = backoff_ == absl::ZeroDuration()
                   ? options_.backoff_min
                   : std::min(backoff_ * 2, options_.backoff_max);
    retry_at_ns_.store(absl::ToUnixNanos(absl::Now() + backoff_));
    return absl::UnavailableError(absl::StrCat(endpoint_.ToString(), ": ", what));
  }

 private:
  std::string IoError() const {
    if (ctx_ == nullptr || ctx_->err == 0) return "no reply";
    // hiredis reports a read timeout as an I/O error with errno EAGAIN.
    if (ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout));
    }
    return ctx_->errstr;
  }
  void Close() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  const RemoteEndpoint endpoint_;
  const RemoteTierOptions& options_;
  redisContext* ctx_ = nullptr;
  absl::Duration backoff_ = absl::ZeroDuration();
  std::atomic<int64_t> retry_at_ns_{0};
};

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options,
                                                              const DiskLayout& layout) {
  absl::StatusOr<RemoteEndpoint> endpoint = ParseRemoteUrl(options.url);
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status s = ValidateDiskLayout(layout); !s.ok()) return s;
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the remote tier's timeout must be positive");
  }
  if (options.backoff_min <= absl::ZeroDuration() || options.backoff_max < options.backoff_min) {
    return absl::InvalidArgumentError("the remote tier needs 0 < backoff_min <= backoff_max");
  }
  if (options.max_queued_blocks <= 0 || options.max_match_blocks <= 0) {
    return absl::InvalidArgumentError(
        "the remote tier's max_queued_blocks and max_match_blocks must be positive");
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
                       const DiskLayout& layout)
    : options_(options), endpoint_(endpoint), layout_(layout), layout_id_(layout.Id()) {
  engine_conn_ = std::make_unique<RedisConnection>(endpoint_, options_);
  publisher_conn_ = std::make_unique<RedisConnection>(endpoint_, options_);
  stats_.configured = true;
  publisher_ = std::thread([this] { PublisherLoop(); });
}

RemoteTier::~RemoteTier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    stats_.stores_dropped += queue_.size();
    queue_.clear();
  }
  publisher_.join();
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

size_t RemoteTier::MatchFrom(absl::Span<const Digest> keys) {
  if (keys.empty() || !engine_conn_->ready()) return 0;
  RedisConnection& c = *engine_conn_;
  if (absl::Status s = c.Ensure(); !s.ok()) {
    CountError(&RemoteTierStats::connect_errors, std::string(s.message()));
    return 0;
  }
  const size_t n = std::min(keys.size(), static_cast<size_t>(options_.max_match_blocks));
  std::vector<std::string> names;
  names.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    names.push_back(KeyOf(keys[i]));
    const char* argv[] = {"EXISTS", names.back().data()};
    const size_t lens[] = {6, names.back().size()};
    if (absl::Status s = c.Append(2, argv, lens); !s.ok()) {
      CountError(&RemoteTierStats::match_errors, std::string(s.message()));
      return 0;
    }
  }
  size_t matched = 0;
  bool prefix = true;
  for (size_t i = 0; i < n; ++i) {  // every reply is read, so the pipeline ends empty
    absl::StatusOr<Reply> r = c.GetReply();
    if (!r.ok()) {
      CountError(&RemoteTierStats::match_errors, std::string(r.status().message()));
      return 0;
    }
    prefix = prefix && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1;
    if (prefix) ++matched;
  }
  c.Succeeded();
  absl::MutexLock lock(&mu_);
  stats_.up = true;
  return matched;
}

absl::Status RemoteTier::Load(const BlockExpectation& expect, absl::Span<uint8_t> out) {
  PREFIXD_CHECK(static_cast<int64_t>(out.size()) == layout_.data_bytes());
  if (!engine_conn_->ready()) return absl::UnavailableError("the remote tier is backing off");
  RedisConnection& c = *engine_conn_;
  if (absl::Status s = c.Ensure(); !s.ok()) {
    CountError(&RemoteTierStats::connect_errors, std::string(s.message()));
    return s;
  }
  const std::string name = KeyOf(expect.key);
  const char* argv[] = {"GET", name.data()};
  const size_t lens[] = {3, name.size()};
  absl::StatusOr<Reply> r = c.Run(2, argv, lens, /*wrong_type_ok=*/true);
  if (!r.ok()) {
    CountError(&RemoteTierStats::load_errors, std::string(r.status().message()));
    return r.status();
  }
  c.Succeeded();
  if ((*r)->type == REDIS_REPLY_NIL) {
    absl::MutexLock lock(&mu_);
    stats_.up = true;
    return absl::NotFoundError("block left the remote tier");
  }
  absl::StatusOr<absl::Span<const uint8_t>> data =
      (*r)->type != REDIS_REPLY_STRING
          ? absl::DataLossError("the remote value is not a string")
          : DecodeBlockFile(std::string_view((*r)->str, (*r)->len), layout_, expect);
  if (!data.ok()) {
    // Never used; deleted so that the next replica to compute it publishes a good one.
    const char* del[] = {"DEL", name.data()};
    const size_t del_lens[] = {3, name.size()};
    if (!c.Run(2, del, del_lens).ok()) {
      CountError(&RemoteTierStats::load_errors, "cannot delete a corrupt value");
    }
    absl::MutexLock lock(&mu_);
    ++stats_.corrupt_blocks;
    return data.status();
  }
  std::memcpy(out.data(), data->data(), out.size());
  absl::MutexLock lock(&mu_);
  stats_.up = true;
  ++stats_.loads;
  RememberLocked(expect.key);  // it is there: no need to publish it when it is recomputed
  return absl::OkStatus();
}

bool RemoteTier::WantsPublish(const Digest& key) {
  absl::MutexLock lock(&mu_);
  if (recent_.contains(key)) return false;
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
  RememberLocked(record.key);
  queue_.push_back(std::move(record));
}

void RemoteTier::RememberLocked(const Digest& key) {
  if (!recent_.insert(key).second) return;
  recent_order_.push_back(key);
  if (recent_order_.size() > kRecentKeys) {
    recent_.erase(recent_order_.front());
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
    const std::string value = EncodeBlockFile(layout_, record);
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
    publishing_ = false;
    if (stored) {
      ++stats_.stores;
      stats_.up = true;
    } else {
      ++stats_.stores_dropped;
      recent_.erase(record.key);  // its place in recent_order_ is dropped lazily
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
