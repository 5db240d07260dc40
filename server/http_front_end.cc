#include "server/http_front_end.h"

#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "engine/request_validation.h"
#include "nlohmann/json.hpp"
#include "server/generate_output.h"
#include "server/openai_api.h"

namespace prefixd {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

struct HttpFrontEnd::Impl {
  HttpFrontEndOptions options;
  int64_t created = 0;  // start time, for /v1/models
  mutable absl::Mutex mu;
  int64_t live_completions ABSL_GUARDED_BY(mu) = 0;
  int64_t open_connections ABSL_GUARDED_BY(mu) = 0;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  // Declared after what sessions use: destroying the io_context destroys the sessions its
  // pending handlers hold, and they count their requests on the way out.
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  int port = 0;

  void Accept();
  bool AtConnectionLimit() {
    absl::MutexLock lock(&mu);
    return options.max_connections > 0 && open_connections >= options.max_connections;
  }
  void ConnectionOpened() {
    absl::MutexLock lock(&mu);
    ++open_connections;
  }
  void ConnectionClosed() {
    absl::MutexLock lock(&mu);
    --open_connections;
  }
  void CompletionStarted() {
    absl::MutexLock lock(&mu);
    ++live_completions;
  }
  void CompletionEnded() {
    absl::MutexLock lock(&mu);
    --live_completions;
  }
};

namespace {

// One running completion: a generation per prompt and what has been sent of each choice.
struct Job {
  struct Generation {
    StartedGenerate started;
    std::optional<GenerateOutput> output;
    bool counted = false;  // FinishGenerate called
  };
  CompletionRequest request;
  ResponseHeader header;
  std::vector<Generation> gens;
  std::vector<Choice> choices;  // non-streamed: the response; streamed: text sent so far
  uint32_t samples = 1;
  bool headers_sent = false;
  bool write_in_flight = false;
  absl::Status first_error;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpFrontEnd::Impl* impl)
      : stream_(std::move(socket)), impl_(impl) {
    impl_->ConnectionOpened();
  }

  ~Session() {
    AbandonJob();
    impl_->ConnectionClosed();
  }

  void Run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::ReadHeader, shared_from_this()));
  }

 private:
  RequestPath& path() { return *impl_->options.path; }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(64 * 1024);
    parser_->body_limit(impl_->options.max_body_bytes);
    stream_.expires_after(std::chrono::milliseconds(
        absl::ToInt64Milliseconds(impl_->options.idle_timeout)));
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  void OnHeader(beast::error_code ec, size_t) {
    // A Content-Length past the limit is refused while the header is parsed.
    if (ec == http::error::body_limit) return SendTooLarge();
    if (ec) return Close();  // end of stream, idle timeout, a malformed header
    const auto& req = parser_->get();
    version_ = req.version();
    keep_alive_ = req.keep_alive();
    if (parser_->content_length().has_value() &&
        *parser_->content_length() > impl_->options.max_body_bytes) {
      return SendTooLarge();
    }
    // A generous time for the body; a client that stalls mid-body is cut off.
    stream_.expires_after(std::chrono::seconds(60));
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                     version_);
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
    if (ec == http::error::body_limit) return SendTooLarge();
    if (ec) return Close();
    stream_.expires_never();
    Handle(parser_->release());
  }

  // The body is not read. Closing at once with unread bytes makes the kernel send a reset,
  // which can destroy the response before the client reads it; so after the response, stop
  // sending and discard what the client still sends, for a few seconds at most.
  void SendTooLarge() {
    keep_alive_ = false;
    auto res = std::make_shared<http::response<http::string_body>>(
        http::status::payload_too_large, version_);
    res->set(http::field::server, "prefixd");
    res->set(http::field::content_type, "application/json");
    res->keep_alive(false);
    res->body() = ErrorJson(absl::InvalidArgumentError(
        absl::StrCat("the request body is larger than ", impl_->options.max_body_bytes,
                     " bytes: send a smaller one")));
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->stream_.expires_after(std::chrono::seconds(3));
      self->Discard();
    });
  }

  void Discard() {
    auto sink = std::make_shared<std::array<char, 65536>>();
    stream_.async_read_some(net::buffer(*sink),
                            [self = shared_from_this(), sink](beast::error_code ec, size_t) {
                              if (ec) return self->Close();
                              self->Discard();
                            });
  }

  void Handle(http::request<http::string_body> req) {
    const std::string target(req.target());
    const std::string_view path_only = std::string_view(target).substr(0, target.find('?'));
    const http::verb method = req.method();
    head_ = method == http::verb::head;
    authorization_.reset();
    if (auto it = req.find(http::field::authorization); it != req.end()) {
      authorization_ = std::string(it->value());
    }
    if (path_only == "/health") {
      if (method != http::verb::get && method != http::verb::head) return MethodNotAllowed("GET");
      if (path().draining()) {
        return SendStatus(absl::UnavailableError("prefixd is shutting down"));
      }
      return Send(http::status::ok, "{\"status\":\"ok\"}");
    }
    if (path_only == "/v1/models") {
      if (method != http::verb::get) return MethodNotAllowed("GET");
      absl::StatusOr<ServedModel> model = path().ModelInfo(authorization_);
      if (!model.ok()) return SendStatus(model.status());
      nlohmann::json body{{"object", "list"},
                          {"data",
                           {{{"id", model->name},
                             {"object", "model"},
                             {"created", impl_->created},
                             {"owned_by", "prefixd"},
                             {"max_model_len", model->config.n_positions}}}}};
      return Send(http::status::ok, body.dump());
    }
    if (path_only == "/v1/completions") {
      if (method != http::verb::post) return MethodNotAllowed("POST");
      return StartCompletion(req.body());
    }
    if (path_only == "/v1/chat/completions") {
      if (method != http::verb::post) return MethodNotAllowed("POST");
      absl::Status s = absl::InvalidArgumentError(
          "model has no chat template: GPT-2 is a base model; use POST /v1/completions");
      s.SetPayload(kInvalidFieldPayload, absl::Cord("model"));
      return SendStatus(s);
    }
    if (path_only == "/tokenize") {
      if (method != http::verb::post) return MethodNotAllowed("POST");
      absl::StatusOr<std::string> text = ParseTokenizeRequest(req.body(), path().model().name);
      if (!text.ok()) return SendStatus(text.status());
      absl::StatusOr<std::vector<uint32_t>> ids = path().Tokenize(authorization_, *text);
      if (!ids.ok()) return SendStatus(ids.status());
      nlohmann::json body{{"tokens", *ids},
                          {"count", ids->size()},
                          {"max_model_len", path().model().config.n_positions}};
      return Send(http::status::ok, body.dump());
    }
    if (path_only == "/detokenize") {
      if (method != http::verb::post) return MethodNotAllowed("POST");
      absl::StatusOr<std::vector<uint32_t>> ids =
          ParseDetokenizeRequest(req.body(), path().model().name);
      if (!ids.ok()) return SendStatus(ids.status());
      absl::StatusOr<std::string> text = path().Detokenize(authorization_, *ids);
      if (!text.ok()) return SendStatus(text.status());
      nlohmann::json body{{"prompt", *text}};
      return Send(http::status::ok, body.dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace));
    }
    SendStatus(absl::NotFoundError(absl::StrCat(
        "no such endpoint: ", std::string(path_only),
        " (prefixd serves POST /v1/completions, GET /v1/models, GET /health, POST /tokenize, "
        "POST /detokenize)")));
  }

  void MethodNotAllowed(const char* allowed) {
    Send(http::status::method_not_allowed,
         ErrorJson(absl::InvalidArgumentError(absl::StrCat("use ", allowed, " here"))));
  }

  void SendStatus(const absl::Status& status) {
    Send(static_cast<http::status>(HttpStatusFor(status.code())), ErrorJson(status));
  }

  void Send(http::status status, std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(status, version_);
    res->set(http::field::server, "prefixd");
    res->set(http::field::content_type, "application/json");
    res->keep_alive(keep_alive_);
    res->body() = std::move(body);
    res->prepare_payload();
    // A response to HEAD has the GET response's headers and no body: a client reads the
    // next response right after the headers (RFC 9110 9.3.2).
    if (head_) res->body().clear();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      if (ec || res->need_eof()) return self->Close();
      self->ReadHeader();
    });
  }

  // ---- completions ----

  void StartCompletion(const std::string& body) {
    absl::StatusOr<CompletionRequest> parsed = ParseCompletionRequest(body, path().model().name);
    if (!parsed.ok()) {
      path().CountRefused(Api::kHttp, parsed.status().code());
      return SendStatus(parsed.status());
    }
    auto job = std::make_unique<Job>();
    job->request = *std::move(parsed);
    job->header.created = absl::ToUnixSeconds(absl::Now());
    job->header.model = path().model().name;
    for (GenerateCall& call : job->request.prompts) {
      call.authorization = authorization_;
      absl::StatusOr<StartedGenerate> started = path().StartGenerate(call);
      if (!started.ok()) {
        // The prompts already queued go back, so that the call is all or nothing.
        for (Job::Generation& g : job->gens) {
          g.started.stream->Cancel();
          path().FinishGenerate(Api::kHttp, absl::StatusCode::kCancelled);
        }
        return SendStatus(ToHttpFieldNames(started.status()));
      }
      Job::Generation& g = job->gens.emplace_back();
      g.output.emplace(path().tokenizer(), started->num_samples, started->stop);
      job->samples = started->num_samples;
      g.started = *std::move(started);
    }
    job->header.id = absl::StrCat("cmpl-", job->gens.front().started.request_id);
    job->choices.resize(job->gens.size() * job->samples);
    for (size_t i = 0; i < job->choices.size(); ++i) {
      job->choices[i].index = static_cast<uint32_t>(i);
      if (job->request.logprobs.has_value()) job->choices[i].logprobs.emplace();
    }
    job_ = std::move(job);
    impl_->CompletionStarted();
    // Engine events arrive on the engine thread: hand them to this connection's strand.
    std::weak_ptr<Session> weak = weak_from_this();
    auto executor = stream_.get_executor();
    for (Job::Generation& g : job_->gens) {
      g.started.stream->SetNotify([weak, executor] {
        net::post(executor, [weak] {
          if (std::shared_ptr<Session> self = weak.lock()) self->OnEngineEvents();
        });
      });
    }
    WatchDisconnect();
    if (job_ != nullptr && job_->request.stream) SendStreamHeader();
  }

  void OnEngineEvents() {
    if (job_ == nullptr) return;
    for (Job::Generation& g : job_->gens) {
      if (g.output->done()) continue;
      std::vector<RequestEvent> events;
      if (g.started.stream->Poll(&events)) g.output->Add(std::move(events));
      for (uint32_t sample : g.output->StoppedSamples()) g.started.stream->StopSample(sample);
    }
    if (job_->request.stream) {
      PumpStream();
    } else {
      PumpWhole();
    }
  }

  // Counts each generation once it is done; true when all are.
  bool CountFinished(std::string* error_events) {
    bool all = true;
    for (Job::Generation& g : job_->gens) {
      if (!g.output->done()) {
        all = false;
        continue;
      }
      if (g.counted) continue;
      g.counted = true;
      path().FinishGenerate(Api::kHttp, g.output->status().code());
      if (!g.output->status().ok()) {
        if (job_->first_error.ok()) job_->first_error = g.output->status();
        if (error_events != nullptr) {
          absl::StrAppend(error_events, "data: ", ErrorJson(g.output->status()), "\n\n");
        }
      }
    }
    return all;
  }

  void PumpWhole() {
    for (size_t gi = 0; gi < job_->gens.size(); ++gi) {
      SampleOutput out;
      while (job_->gens[gi].output->Next(&out)) {
        AppendToChoice(path().tokenizer(), out,
                       &job_->choices[gi * job_->samples + out.sample_index]);
      }
    }
    if (!CountFinished(nullptr)) return;
    std::unique_ptr<Job> job = std::move(job_);
    impl_->CompletionEnded();
    if (!job->first_error.ok()) return SendStatus(job->first_error);
    Send(http::status::ok, CompletionJson(job->header, job->choices, TotalUsageOf(*job)));
  }

  static Usage TotalUsageOf(const Job& job) {
    Usage total;
    for (const Job::Generation& g : job.gens) {
      const Usage u = g.output->usage();
      total.prompt_tokens += u.prompt_tokens;
      total.cached_prompt_tokens += u.cached_prompt_tokens;
      total.completion_tokens += u.completion_tokens;
    }
    return total;
  }

  void SendStreamHeader() {
    auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
    res->set(http::field::server, "prefixd");
    res->set(http::field::content_type, "text/event-stream");
    res->set(http::field::cache_control, "no-cache");
    res->keep_alive(keep_alive_);
    res->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
    job_->write_in_flight = true;
    http::async_write_header(stream_, *sr,
                             [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
                               if (ec) return self->ClientGone();
                               if (self->job_ == nullptr) return;
                               self->job_->headers_sent = true;
                               self->job_->write_in_flight = false;
                               self->PumpStream();
                             });
  }

  void PumpStream() {
    if (job_ == nullptr || !job_->headers_sent || job_->write_in_flight) return;
    auto data = std::make_shared<std::string>();
    for (size_t gi = 0; gi < job_->gens.size(); ++gi) {
      SampleOutput out;
      while (job_->gens[gi].output->Next(&out)) {
        Choice& sent = job_->choices[gi * job_->samples + out.sample_index];
        Choice delta;
        delta.index = sent.index;
        if (job_->request.logprobs.has_value()) delta.logprobs.emplace();
        AppendToChoice(path().tokenizer(), out, &delta);
        if (delta.logprobs.has_value()) {
          for (uint32_t& offset : delta.logprobs->text_offset) offset += sent.text.size();
        }
        sent.text += delta.text;
        data->append(CompletionChunk(job_->header, delta));
      }
    }
    const bool all_done = CountFinished(data.get());
    if (all_done) {
      if (job_->request.include_usage) data->append(UsageChunk(job_->header, TotalUsageOf(*job_)));
      data->append(kDoneEvent);
    }
    if (data->empty()) return;
    job_->write_in_flight = true;
    net::async_write(stream_, http::make_chunk(net::buffer(*data)),
                     [self = shared_from_this(), data, all_done](beast::error_code ec, size_t) {
                       if (ec) return self->ClientGone();
                       if (all_done) return self->EndStream();
                       if (self->job_ == nullptr) return;
                       self->job_->write_in_flight = false;
                       self->PumpStream();
                     });
  }

  void EndStream() {
    if (job_ != nullptr) {
      job_.reset();
      impl_->CompletionEnded();
    }
    net::async_write(stream_, http::make_chunk_last(),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec || !self->keep_alive_) return self->Close();
                       self->ReadHeader();
                     });
  }

  // While a completion runs nothing is read from the client, so a closed connection would go
  // unnoticed until a write fails; waiting for readability sees the FIN or RST at once.
  void WatchDisconnect() {
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        net::bind_executor(stream_.get_executor(),
                           [self = shared_from_this()](beast::error_code ec) {
                             self->OnReadable(ec);
                           }));
  }

  void OnReadable(beast::error_code ec) {
    if (job_ == nullptr) return;
    if (ec) return ClientGone();
    char byte;
    const ssize_t n =
        ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return ClientGone();
    }
    // n > 0: the client sent more (a pipelined request); it stays buffered for the next read.
    if (n < 0) WatchDisconnect();
  }

  // The client went away: cancel what still runs (the engine frees its blocks at its next
  // step) and count it now; events that still arrive are ignored.
  void ClientGone() {
    AbandonJob();
    Close();
  }

  void AbandonJob() {
    if (job_ == nullptr) return;
    for (Job::Generation& g : job_->gens) {
      if (g.counted) continue;
      g.counted = true;
      g.started.stream->Cancel();
      path().FinishGenerate(Api::kHttp, absl::StatusCode::kCancelled);
    }
    job_.reset();
    impl_->CompletionEnded();
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpFrontEnd::Impl* const impl_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;  // the request being answered is HEAD
  std::optional<std::string> authorization_;
  std::unique_ptr<Job> job_;
};

}  // namespace

void HttpFrontEnd::Impl::Accept() {
  if (AtConnectionLimit()) {
    // New connections wait in the listen queue; look again when one may have closed.
    auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
    timer->async_wait([this, timer](beast::error_code ec) {
      if (!ec) Accept();
    });
    return;
  }
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;  // Stop()
      // Out of descriptors and the like: keep accepting, after a pause that lets them free.
      if (options.log) options.log(absl::StrCat("http: accept failed: ", ec.message()));
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](beast::error_code) { Accept(); });
      return;
    }
    std::make_shared<Session>(std::move(socket), this)->Run();
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpFrontEnd>> HttpFrontEnd::Start(HttpFrontEndOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->created = absl::ToUnixSeconds(absl::Now());
  const std::string& listen = impl->options.listen;
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen ", listen, " is not HOST:PORT (or off)"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  beast::error_code ec;
  tcp::resolver resolver(impl->ioc);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec || endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen ", listen, ": cannot resolve ", host, ": ", ec.message()));
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  auto fail = [&](const char* what) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (HTTP): ", what, ": ", ec.message()));
  };
  impl->acceptor.open(endpoint.protocol(), ec);
  if (ec) return fail("open");
  // Like gRPC's listener: refuse a port another process holds (no SO_REUSEPORT).
  impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  impl->acceptor.bind(endpoint, ec);
  if (ec) return fail("bind");
  impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  const int threads = std::max(1, impl->options.threads);
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([p = impl.get()] { p->ioc.run(); });
  }
  return std::unique_ptr<HttpFrontEnd>(new HttpFrontEnd(std::move(impl)));
}

HttpFrontEnd::HttpFrontEnd(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpFrontEnd::~HttpFrontEnd() { Stop(); }

int HttpFrontEnd::port() const { return impl_->port; }

int64_t HttpFrontEnd::open_connections() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->open_connections;
}

int64_t HttpFrontEnd::live_completions() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->live_completions;
}

bool HttpFrontEnd::WaitForNoCompletions(absl::Duration timeout) {
  absl::MutexLock lock(&impl_->mu);
  Impl* impl = impl_.get();
  auto idle = [impl]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->mu) {
    return impl->live_completions == 0;
  };
  return impl_->mu.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void HttpFrontEnd::Stop() {
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);  // no thread runs the io_context any more
}

}  // namespace prefixd
