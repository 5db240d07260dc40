// RedisConnection: one hiredis connection of the remote tier (cache/remote/remote_tier.h), with
// a timeout on every call, an optional deadline, a backoff after every failure and hiredis's
// reader fed in large reads. Internal to cache/remote/: only remote_tier.cc includes it.
#ifndef PREFIXD_CACHE_REMOTE_REDIS_CONNECTION_H_
#define PREFIXD_CACHE_REMOTE_REDIS_CONNECTION_H_

#include <hiredis.h>
#include <poll.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/remote/remote_tier.h"
#include "cache/remote/remote_tier_options.h"

namespace prefixd {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

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
    backoff_ = backoff_ == absl::ZeroDuration() ? options_.backoff_min
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
  std::unique_ptr<char[]> read_buffer_;            // ReadReply's, made on the first read
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

}  // namespace prefixd

#endif  // PREFIXD_CACHE_REMOTE_REDIS_CONNECTION_H_
