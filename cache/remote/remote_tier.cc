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
  bool connected() const { return ctx_ != nullptr; }

  // Until changed, connecting and every reply must also be done by `deadline` (a fetch's or
  // a match's, `bound` after it was asked for); absl::InfiniteFuture(): each is bounded by
  // the command timeout only.
  void SetDeadline(absl::Time deadline, absl::Duration bound) {
    deadline_ = deadline;
    deadline_bound_ = bound;
  }
  // Whether the last failure was the deadline passing (not the server or the network).
  bool deadline_passed() const { return deadline_passed_; }
  // While set (and a deadline is), a wait for a reply also wakes when `fd` (an eventfd) is
  // written, drains it, runs `hook` (which may Append commands) and sends what it appended.
  void SetWaitHook(int fd, std::function<void()> hook) {
    hook_fd_ = fd;
    hook_ = std::move(hook);
  }

  // Connects (and authenticates, selects the database) when not connected. Non-OK (with the
  // backoff started) on a failure.
  absl::Status Ensure() {
    deadline_passed_ = false;
    if (ctx_ != nullptr) return absl::OkStatus();
    const timeval tv = absl::ToTimeval(options_.timeout);
    const absl::Duration left = std::min(options_.timeout, deadline_ - absl::Now());
    if (left <= absl::ZeroDuration()) return Failed(DeadlinePassed());
    const timeval connect_tv = absl::ToTimeval(left);
    ctx_ = endpoint_.unix_path.empty()
               ? redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, connect_tv)
               : redisConnectUnixWithTimeout(endpoint_.unix_path.c_str(), connect_tv);
    if (ctx_ == nullptr) return Failed("cannot allocate a connection");
    if (ctx_->err != 0) return Failed(absl::StrCat("connect: ", ctx_->errstr));
    if (redisSetTimeout(ctx_, tv) != REDIS_OK) return Failed("cannot set the socket timeout");
    // Our createString (SinkString) hands top-level bulk strings to the sink when one is set
    // and every other reply to hiredis's own functions.
    defaults_ = ctx_->reader->fn;
    functions_ = *defaults_;
    functions_.createString = &RedisConnection::SinkString;
    ctx_->reader->fn = &functions_;
    ctx_->reader->privdata = this;  // (redisReaderSetPrivdata casts it to int)
    // Keep the read buffer between replies: by default hiredis frees it once it holds more
    // than 16 KiB unused, and the next 1.2 MB GET grows a new one through fresh pages.
    ctx_->reader->maxbuf = 0;
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
    if (absl::Status s = Append(argc, argv, lens); !s.ok()) return s;
    return GetReply(wrong_type_ok);
  }

  // Appends a command to the pipeline (sent with the first GetReply).
  absl::Status Append(int argc, const char** argv, const size_t* lens) {
    if (redisAppendCommandArgv(ctx_, argc, argv, lens) != REDIS_OK) return Failed(IoError());
    return absl::OkStatus();
  }
  // The next pipelined reply; `wrong_type_ok` as for Run.
  absl::StatusOr<Reply> GetReply(bool wrong_type_ok = false) {
    void* raw = nullptr;
    if (absl::Status s = ReadReply(&raw); !s.ok()) return s;
    Reply r(static_cast<redisReply*>(raw));
    if (r->type == REDIS_REPLY_ERROR) {
      std::string text(r->str, r->len);
      if (wrong_type_ok && absl::StartsWith(text, "WRONGTYPE")) return r;
      return Failed(text);
    }
    return r;
  }

  // While set, a reply that is a bulk string (a fetched value) is assigned to `*sink` instead of
  // a fresh allocation, and the reply returned carries an empty string; sunk() tells it apart
  // from an empty value. A 1.2 MB allocation per value costs its page faults on every GET
  // (the allocator returns it to the system when it is freed), and a buffer that held a
  // value before takes the next one without allocating. Null (the default): as hiredis
  // allocates them.
  void SinkStringsInto(std::vector<uint8_t>* sink) {
    sink_ = sink;
    sunk_ = false;
  }
  // Whether the last reply's string went to the sink.
  bool sunk() const { return sunk_; }

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
  std::string DeadlinePassed() {
    deadline_passed_ = true;
    return absl::StrCat("the deadline passed (", absl::FormatDuration(deadline_bound_),
                        " after it was asked for)");
  }
  // Waits until the socket is readable, for at most the command timeout and until the
  // deadline; OK when it is.
  absl::Status AwaitReadable() {
    if (deadline_ == absl::InfiniteFuture()) return absl::OkStatus();  // SO_RCVTIMEO bounds it
    while (true) {
      const absl::Duration left = deadline_ - absl::Now();
      if (left <= absl::ZeroDuration()) return Failed(DeadlinePassed());
      const bool deadline_first = left < options_.timeout;
      const absl::Duration wait = deadline_first ? left : options_.timeout;
      pollfd p[2] = {{.fd = ctx_->fd, .events = POLLIN, .revents = 0},
                     {.fd = hook_fd_, .events = POLLIN, .revents = 0}};
      const int n = poll(
          p, hook_ ? 2 : 1,
          static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1)))));
      if (n > 0 && p[0].revents != 0) return absl::OkStatus();
      if (n > 0) {
        uint64_t count;
        if (read(hook_fd_, &count, sizeof(count)) < 0 && errno != EAGAIN) {
          return Failed(absl::StrCat("eventfd: ", std::strerror(errno)));
        }
        hook_();
        if (ctx_ == nullptr) return absl::UnavailableError("the connection failed");
        int sent = 0;
        do {
          if (redisBufferWrite(ctx_, &sent) != REDIS_OK) return Failed(IoError());
        } while (!sent);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Failed(absl::StrCat("poll: ", std::strerror(errno)));
      if (!deadline_first) {
        return Failed(absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout)));
      }
    }
  }
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
  // Sends what the pipeline holds and waits for the next reply (in *reply, non-null). What
  // redisGetReply does, but hiredis reads 16 KiB per read(2): a 1.2 MB value is then about 75
  // system calls, and Redis is woken as often to refill the socket. This reads up to
  // kReadBytes at a time and feeds them to hiredis's reader (the protocol stays hiredis's):
  // a GET of a block costs the client about 40 % less CPU, and Redis about 25 % less
  // (docs/BENCHMARKS.md, "With the shared Redis tier").
  absl::Status ReadReply(void** reply) {
    deadline_passed_ = false;
    if (ctx_ == nullptr) return absl::UnavailableError("not connected");
    int sent = 0;
    do {
      if (redisBufferWrite(ctx_, &sent) != REDIS_OK) return Failed(IoError());
    } while (!sent);
    if (redisGetReplyFromReader(ctx_, reply) != REDIS_OK) return Failed(IoError());
    if (read_buffer_ == nullptr && *reply == nullptr) {
      read_buffer_ = std::make_unique<char[]>(kReadBytes);
    }
    while (*reply == nullptr) {
      if (absl::Status s = AwaitReadable(); !s.ok()) return s;
      const ssize_t n = read(ctx_->fd, read_buffer_.get(), kReadBytes);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return Failed("the server closed the connection");
      if (n < 0) {
        const int e = errno;
        return Failed(e == EAGAIN || e == EWOULDBLOCK
                          ? absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout))
                          : absl::StrCat("read: ", std::strerror(e)));
      }
      if (redisReaderFeed(ctx_->reader, read_buffer_.get(), static_cast<size_t>(n)) != REDIS_OK ||
          redisGetReplyFromReader(ctx_, reply) != REDIS_OK) {
        return Failed(IoError());
      }
    }
    return absl::OkStatus();
  }
  static constexpr size_t kReadBytes = 512 << 10;
  static void* SinkString(const redisReadTask* task, char* str, size_t len) {
    RedisConnection* c = static_cast<RedisConnection*>(task->privdata);
    if (c->sink_ == nullptr || task->parent != nullptr || task->type != REDIS_REPLY_STRING) {
      return c->defaults_->createString(task, str, len);
    }
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(str);
    c->sink_->assign(bytes, bytes + len);  // one memcpy (the same element type)
    c->sunk_ = true;
    return c->defaults_->createString(task, str, 0);
  }

  const RemoteEndpoint endpoint_;
  const RemoteTierOptions& options_;
  redisContext* ctx_ = nullptr;
  std::unique_ptr<char[]> read_buffer_;  // ReadReply's, made on the first read
  redisReplyObjectFunctions* defaults_ = nullptr;  // hiredis's, for every reply not sunk
  redisReplyObjectFunctions functions_{};
  std::vector<uint8_t>* sink_ = nullptr;
  bool sunk_ = false;
  absl::Duration backoff_ = absl::ZeroDuration();
  absl::Time deadline_ = absl::InfiniteFuture();
  absl::Duration deadline_bound_ = absl::ZeroDuration();
  bool deadline_passed_ = false;
  int hook_fd_ = -1;
  std::function<void()> hook_;
  std::atomic<int64_t> retry_at_ns_{0};
};

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
  if (auto it = recent_.find(key); it != recent_.end() && (it->second || !publish.scored)) {
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
  auto [it, inserted] = recent_.try_emplace(key, scored);
  if (!inserted) {
    it->second = it->second || scored;
    return;
  }
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
