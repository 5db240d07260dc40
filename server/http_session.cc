#include "server/http_session.h"

#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "server/openai_api.h"

namespace prefixd {

void HttpLiveCounts::Add(int64_t* counter, int64_t delta) {
  absl::MutexLock lock(&mu_);
  *counter += delta;
}

int64_t HttpLiveCounts::open_connections() const {
  absl::MutexLock lock(&mu_);
  return open_connections_;
}

int64_t HttpLiveCounts::live_completions() const {
  absl::MutexLock lock(&mu_);
  return live_completions_;
}

bool HttpLiveCounts::WaitForNoCompletions(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_completions_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, const HttpSessionContext* context, HttpSessionKind kind)
      : stream_(std::move(socket)),
        read_timer_(stream_.get_executor()),
        context_(*context),
        kind_(kind) {
    context_.counts->ConnectionOpened();
  }

  ~Session() {
    EndCompletion();
    context_.counts->ConnectionClosed();
  }

  void Run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::ReadHeader, shared_from_this()));
  }

 private:
  // Request line and header fields together; past it a request is refused with 414 or 431.
  static constexpr uint32_t kHeaderLimit = 64 * 1024;

  // Waits (up to the idle timeout) for the next request's first bytes, unless a pipelined
  // one is already buffered, then gives its header the header timeout.
  void ReadHeader() {
    if (buffer_.size() > 0) return ReadRestOfHeader();
    stream_.expires_after(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(context_.idle_timeout)));
    stream_.async_read_some(buffer_.prepare(kFirstReadBytes),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->Close();  // end of stream, idle timeout, a reset
                              self->buffer_.commit(n);
                              self->ReadRestOfHeader();
                            });
  }
  static constexpr size_t kFirstReadBytes = 4096;

  void ReadRestOfHeader() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(context_.max_body_bytes);
    StartReadDeadline(context_.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  // The header's and the body's deadlines are a timer of their own, not the stream's expiry
  // (which closes the socket): when one passes, the read is cancelled and OnHeader or OnBody
  // answers 408.
  void StartReadDeadline(absl::Duration limit) {
    stream_.expires_never();
    read_timed_out_ = false;
    read_timer_.expires_after(std::chrono::milliseconds(absl::ToInt64Milliseconds(limit)));
    read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;  // cancelled: the read ended, or the connection did, in time
      self->read_timed_out_ = true;
      self->stream_.cancel();
    });
  }

  void OnHeader(beast::error_code ec, size_t) {
    read_timer_.cancel();
    // A Content-Length past the limit is refused while the header is parsed.
    if (ec == http::error::body_limit) return SendTooLarge();
    if (ec) {
      head_ = false;
      version_ = 11;
      if (read_timed_out_) {
        return Refuse(408,
                      absl::StrCat("the request's header was not complete ",
                                   absl::FormatDuration(context_.header_timeout),
                                   " after its first byte (--request-header-timeout): send the "
                                   "request line and header fields at once"),
                      absl::StatusCode::kDeadlineExceeded);
      }
      if (std::optional<Refusal> r = FramingRefusal(ec)) return Refuse(r->status, r->message);
      return Close();  // end of stream, idle timeout, a reset
    }
    const auto& req = parser_->get();
    version_ = req.version();
    keep_alive_ = req.keep_alive();
    head_ = req.method() == http::verb::head;
    if (std::optional<std::string> bad = ConflictingLength(req)) return Refuse(400, *bad);
    if (kind_ == HttpSessionKind::kReserved) {
      keep_alive_ = false;  // one answer, then the reserved connection is free again
      const std::string_view target(req.target().data(), req.target().size());
      if (target.substr(0, target.find('?')) != context_.reserved_path) {
        return Refuse(503,
                      absl::StrCat("this server is at its connection limit (", context_.limit_name,
                                   "): the connections past it serve only ", context_.reserved_path,
                                   "; retry, or reuse a kept-alive connection"),
                      absl::StatusCode::kUnavailable);
      }
    }
    if (parser_->content_length().has_value() &&
        *parser_->content_length() > context_.max_body_bytes) {
      return SendTooLarge();
    }
    StartReadDeadline(context_.body_timeout);
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto cont =
          std::make_shared<http::response<http::empty_body>>(http::status::continue_, version_);
      http::async_write(stream_, *cont,
                        [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnBody, shared_from_this()));
  }

  void OnBody(beast::error_code ec, size_t) {
    read_timer_.cancel();
    if (ec == http::error::body_limit) return SendTooLarge();
    if (ec) {
      if (read_timed_out_) {
        return Refuse(408,
                      absl::StrCat("the request's body was not complete ",
                                   absl::FormatDuration(context_.body_timeout),
                                   " after its header (--request-body-timeout): send the whole "
                                   "body without pausing"),
                      absl::StatusCode::kDeadlineExceeded);
      }
      if (std::optional<Refusal> r = FramingRefusal(ec)) return Refuse(r->status, r->message);
      return Close();
    }
    stream_.expires_never();
    // Last resort: nothing a client sends may raise through an I/O thread. A handler that
    // throws all the same answers 500 and closes this connection; every other goes on.
    try {
      Handle(parser_->release());
    } catch (const std::exception& e) {
      InternalError(e.what());
    } catch (...) {
      InternalError("unknown exception");
    }
  }

  void InternalError(absl::string_view what) {
    if (context_.log) {
      context_.log(absl::StrCat("http: internal error handling a request: ", what));
    }
    EndCompletion();
    keep_alive_ = false;
    Reply(ErrorReply(absl::InternalError("internal error handling this request (logged)")));
  }

  struct Refusal {
    int status;
    std::string message;
  };

  // What a request the parser refused is answered with, or nullopt for what is no request
  // at all (the client closed or reset the connection, or a timeout ran out).
  std::optional<Refusal> FramingRefusal(beast::error_code ec) const {
    if (ec.category() != beast::http::make_error_code(http::error::bad_method).category() ||
        ec == http::error::end_of_stream || ec == http::error::partial_message) {
      return std::nullopt;
    }
    const auto& fields = parser_->get();  // those parsed before the error
    if (ec == http::error::header_limit) {
      const std::string_view seen(static_cast<const char*>(buffer_.data().data()), buffer_.size());
      if (seen.find("\r\n") == std::string_view::npos) {
        return Refusal{414, absl::StrCat("the request line is longer than ", kHeaderLimit,
                                         " bytes: send a shorter URL (large inputs go in a "
                                         "POST body)")};
      }
      return Refusal{431, absl::StrCat("the request's header fields are larger than ", kHeaderLimit,
                                       " bytes: send fewer or shorter ones")};
    }
    const bool has_length = fields.count(http::field::content_length) > 0;
    const bool has_encoding = fields.count(http::field::transfer_encoding) > 0;
    if ((ec == http::error::bad_content_length && has_encoding) ||
        (ec == http::error::bad_transfer_encoding && has_length)) {
      return Refusal{400, std::string(kBothLengths)};
    }
    if (ec == http::error::bad_content_length) {
      return Refusal{400, has_length ? std::string(kTwoLengths)
                                     : "Content-Length is not a decimal length: send the "
                                       "body's size in bytes"};
    }
    return Refusal{400, absl::StrCat("malformed HTTP request (", ec.message(),
                                     "): send an HTTP/1.1 request as RFC 9112 defines it")};
  }

  static constexpr std::string_view kBothLengths =
      "the request has both Content-Length and Transfer-Encoding, which a proxy and this "
      "server could read differently: send one of them (RFC 9112 6.1)";
  static constexpr std::string_view kTwoLengths =
      "the request has more than one Content-Length field: send one (RFC 9112 6.3)";

  // A header the parser took but that frames the body ambiguously (request smuggling): both
  // a length and an encoding, or a length given twice even with one value.
  static std::optional<std::string> ConflictingLength(const http::request_header<>& req) {
    const size_t lengths = req.count(http::field::content_length);
    if (lengths > 0 && req.count(http::field::transfer_encoding) > 0) {
      return std::string(kBothLengths);
    }
    if (lengths > 1) return std::string(kTwoLengths);
    return std::nullopt;
  }

  // The body is not read. Closing at once with unread bytes makes the kernel send a reset,
  // which can destroy the response before the client reads it; so after the response, stop
  // sending and discard what the client still sends, for a few seconds at most.
  void SendTooLarge() {
    Refuse(413, absl::StrCat("the request body is larger than ", context_.max_body_bytes,
                             " bytes: send a smaller one"));
  }

  // Answers `status` with `message` in OpenAI's error shape (`code`: its gRPC name), then
  // closes as above.
  void Refuse(int status, std::string_view message,
              absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    keep_alive_ = false;
    const absl::string_view text(message.data(), message.size());  // Debian's absl type
    auto res = MakeResponse(status, ErrorJson(absl::Status(code, text)));
    stream_.expires_after(kRefusalWriteTimeout);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, size_t) {
                        if (ec) return self->Close();
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                        self->stream_.expires_after(std::chrono::seconds(3));
                        self->Discard();
                      });
  }

  // A refusal is a few hundred bytes: a client that does not take them in this long is gone.
  static constexpr std::chrono::seconds kRefusalWriteTimeout{2};

  void Discard() {
    auto sink = std::make_shared<std::array<char, 65536>>();
    stream_.async_read_some(net::buffer(*sink),
                            [self = shared_from_this(), sink](beast::error_code ec, size_t) {
                              if (ec) return self->Close();
                              self->Discard();
                            });
  }

  void Handle(http::request<http::string_body> req) {
    HttpRequestView view;
    const std::string method(req.method_string());
    const std::string target(req.target());
    view.method = method;
    view.target = target;
    if (auto it = req.find(http::field::authorization); it != req.end()) {
      view.authorization = std::string(it->value());
    }
    view.body = &req.body();
    HttpRouted routed = context_.handler->Route(view);
    if (HttpReply* reply = std::get_if<HttpReply>(&routed)) return Reply(std::move(*reply));
    if (HttpDeferred* deferred = std::get_if<HttpDeferred>(&routed)) {
      return Defer(std::move(deferred->work));
    }
    StartCompletion(std::get<std::unique_ptr<HttpCompletion>>(std::move(routed)));
  }

  // Runs `work` on the background executor and answers with its reply on this strand.
  // Nothing is read meanwhile: a pipelined request waits in the socket.
  void Defer(std::function<HttpReply()> work) {
    context_.background->Post([self = shared_from_this(), work = std::move(work)] {
      HttpReply reply;
      try {
        reply = work();
      } catch (const std::exception& e) {
        reply = ErrorReply(absl::InternalError("internal error handling this request (logged)"));
        if (self->context_.log) {
          self->context_.log(absl::StrCat("http: internal error handling a request: ", e.what()));
        }
      }
      net::post(self->stream_.get_executor(),
                [self, reply = std::move(reply)]() mutable { self->Reply(std::move(reply)); });
    });
  }

  std::shared_ptr<http::response<http::string_body>> MakeResponse(
      int status, std::string body, const std::string& content_type = "application/json") {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(status), version_);
    res->set(http::field::server, "prefixd");
    res->set(http::field::content_type, content_type);
    res->keep_alive(keep_alive_);
    res->body() = std::move(body);
    res->prepare_payload();
    // A response to HEAD has the GET response's headers and no body: a client reads the
    // next response right after the headers (RFC 9110 9.3.2).
    if (head_) res->body().clear();
    return res;
  }

  void Reply(HttpReply reply) {
    auto res = MakeResponse(reply.status, std::move(reply.body), reply.content_type);
    if (!reply.allow.empty()) res->set(http::field::allow, reply.allow);
    auto sr = std::make_shared<http::response_serializer<http::string_body>>(*res);
    WriteReply(sr, [self = shared_from_this(), res](beast::error_code ec) {
      if (ec || res->need_eof()) return self->Close();
      self->ReadHeader();
    });
  }

  // ---- writes: a client that stops reading is cut off ----

  // The stream's expiry, armed before each write and disarmed when it is done: when it passes
  // the socket closes and the write fails. Every write of a response goes out in the pieces
  // the socket takes, the deadline re-armed for each, so that it ends a client that takes
  // nothing for write_timeout and not one that reads slowly.
  void ArmWriteDeadline() {
    stream_.expires_after(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(context_.write_timeout)));
  }

  void WriteReply(std::shared_ptr<http::response_serializer<http::string_body>> sr,
                  std::function<void(beast::error_code)> done) {
    ArmWriteDeadline();
    http::async_write_some(stream_, *sr,
                           [self = shared_from_this(), sr, done = std::move(done)](
                               beast::error_code ec, size_t) mutable {
                             if (!ec && !sr->is_done())
                               return self->WriteReply(std::move(sr), std::move(done));
                             if (!ec) self->stream_.expires_never();
                             done(ec);
                           });
  }

  void WriteBytes(std::shared_ptr<std::string> bytes, size_t from,
                  std::function<void(beast::error_code)> done) {
    ArmWriteDeadline();
    stream_.async_write_some(net::buffer(*bytes) + from,
                             [self = shared_from_this(), bytes, from, done = std::move(done)](
                                 beast::error_code ec, size_t n) mutable {
                               if (!ec && from + n < bytes->size()) {
                                 return self->WriteBytes(std::move(bytes), from + n,
                                                         std::move(done));
                               }
                               if (!ec) self->stream_.expires_never();
                               done(ec);
                             });
  }

  // ---- completions ----

  void StartCompletion(std::unique_ptr<HttpCompletion> completion) {
    completion_ = std::move(completion);
    context_.counts->CompletionStarted();
    // Engine events arrive on the engine thread: hand them to this connection's strand.
    std::weak_ptr<Session> weak = weak_from_this();
    auto executor = stream_.get_executor();
    completion_->SetNotify([weak, executor] {
      net::post(executor, [weak] {
        if (std::shared_ptr<Session> self = weak.lock()) self->OnEngineEvents();
      });
    });
    WatchDisconnect();
    if (completion_->streamed()) SendStreamHeader();
  }

  void OnEngineEvents() {
    if (completion_ == nullptr) return;
    completion_->Poll();
    if (completion_->streamed()) return PumpStream();
    if (std::optional<HttpReply> reply = completion_->TakeWhole()) {
      EndCompletion();
      Reply(*std::move(reply));
    }
  }

  void SendStreamHeader() {
    auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
    res->set(http::field::server, "prefixd");
    res->set(http::field::content_type, "text/event-stream");
    res->set(http::field::cache_control, "no-cache");
    // HTTP/1.0 has no chunks (a server must not send it Transfer-Encoding, RFC 9112 6.1):
    // the events go out as they are, and the close ends the response.
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;
    res->keep_alive(keep_alive_);
    res->chunked(chunked_);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
    write_in_flight_ = true;
    ArmWriteDeadline();  // a few hundred bytes: one write
    http::async_write_header(stream_, *sr,
                             [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
                               if (ec) return self->ClientGone();
                               self->stream_.expires_never();
                               if (self->completion_ == nullptr) return;
                               self->headers_sent_ = true;
                               self->write_in_flight_ = false;
                               self->PumpStream();
                             });
  }

  void PumpStream() {
    if (completion_ == nullptr || !headers_sent_ || write_in_flight_) return;
    bool last = false;
    std::string events = completion_->TakeStreamBytes(&last);
    if (events.empty()) return;
    // A chunk: its size in hex, CRLF, the bytes, CRLF (RFC 9112 7.1).
    auto data = std::make_shared<std::string>(
        chunked_ ? absl::StrCat(absl::Hex(events.size()), "\r\n", events, "\r\n")
                 : std::move(events));
    write_in_flight_ = true;
    WriteBytes(data, 0, [self = shared_from_this(), last](beast::error_code ec) {
      if (ec) return self->ClientGone();
      if (last) return self->EndStream();
      if (self->completion_ == nullptr) return;
      self->write_in_flight_ = false;
      self->PumpStream();
    });
  }

  void EndStream() {
    EndCompletion();
    if (!chunked_) {
      // The close ends an unchunked response: stop sending, and let the client take it in
      // before the connection goes (as after a refusal).
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      stream_.expires_after(std::chrono::seconds(3));
      return Discard();
    }
    WriteBytes(std::make_shared<std::string>("0\r\n\r\n"), 0,
               [self = shared_from_this()](beast::error_code ec) {
                 if (ec || !self->keep_alive_) return self->Close();
                 self->ReadHeader();
               });
  }

  // While a completion runs nothing is parsed, so a closed connection would go unnoticed until
  // a write fails; waiting for readability sees the FIN or RST at once. What a client sends
  // meanwhile is a pipelined request (RFC 9112 9.3): it is moved into buffer_, where the
  // next ReadHeader parses it once this response is written, and the wait goes on. Past
  // kMaxPipelinedBytes the session stops reading (the kernel's window pushes back on the
  // client) and pins itself until the completion ends, since no handler holds it then: a
  // disconnect is then noticed at the next write.
  static constexpr size_t kMaxPipelinedBytes = 64 * 1024;

  void WatchDisconnect() {
    if (watching_) return;  // a wait from an earlier completion is still armed
    watching_ = true;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        net::bind_executor(
            stream_.get_executor(),
            [self = shared_from_this()](beast::error_code ec) { self->OnReadable(ec); }));
  }

  void OnReadable(beast::error_code ec) {
    watching_ = false;
    if (completion_ == nullptr) return;
    if (ec) return ClientGone();
    if (buffer_.size() >= kMaxPipelinedBytes) {
      pinned_ = shared_from_this();
      return;
    }
    const size_t room = kMaxPipelinedBytes - buffer_.size();
    const ssize_t n =
        ::recv(stream_.socket().native_handle(), buffer_.prepare(room).data(), room, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return ClientGone();
    }
    if (n > 0) buffer_.commit(static_cast<size_t>(n));
    WatchDisconnect();
  }

  // The client went away: cancel what still runs (the engine frees its blocks at its next
  // step) and count it now; events that still arrive are ignored.
  void ClientGone() {
    EndCompletion();
    Close();
  }

  // The completion is over (sent, or abandoned: what still runs is cancelled and counted).
  void EndCompletion() {
    if (completion_ == nullptr) return;
    completion_->Abandon();
    completion_.reset();
    headers_sent_ = false;
    write_in_flight_ = false;
    context_.counts->CompletionEnded();
    // Every caller holds its own reference, so this is never the last one.
    pinned_.reset();
  }

  void Close() {
    read_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  net::steady_timer read_timer_;  // the header's or the body's deadline; on the stream's strand
  bool read_timed_out_ = false;   // it passed while the header or the body was being read
  const HttpSessionContext& context_;
  const HttpSessionKind kind_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;  // the request being answered is HEAD
  std::unique_ptr<HttpCompletion> completion_;
  bool headers_sent_ = false;
  bool chunked_ = true;  // the stream's body goes in chunks (not to HTTP/1.0)
  bool write_in_flight_ = false;
  bool watching_ = false;            // a readability wait is armed
  std::shared_ptr<Session> pinned_;  // set while reading is paused under a completion
};

}  // namespace

void StartHttpSession(boost::asio::ip::tcp::socket socket, const HttpSessionContext* context,
                      HttpSessionKind kind) {
  std::make_shared<Session>(std::move(socket), context, kind)->Run();
}

}  // namespace prefixd
