#include "server/http_front_end.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio.hpp"
#include "server/http_session.h"

namespace prefixd {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// Declared in the order things must outlive each other: sessions use the handler, counts
// and context, and destroying the io_context destroys the sessions its pending handlers
// hold (they count themselves out on the way).
struct HttpFrontEnd::Impl {
  HttpFrontEndOptions options;
  HttpLiveCounts counts;
  HttpSessionContext context;
  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  net::io_context ioc;
  // Deferred replies (adapter loads), off the I/O threads; one at a time. Destroyed before
  // the io_context: what it still runs posts its reply there.
  std::unique_ptr<Executor> background = std::make_unique<Executor>(1);
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;  // one per resolved address
  std::vector<std::thread> threads;
  int port = 0;

  // At the limit, the next connections accepted serve the reserved path only; past the
  // reserve too, none is accepted.
  bool AtConnectionLimit() const {
    return options.max_connections > 0 && counts.open_connections() >= options.max_connections;
  }
  bool AtReserveLimit() const {
    return options.max_connections > 0 &&
           counts.open_connections() >=
               options.max_connections + ReservedConnections(options.max_connections);
  }
  void Accept(tcp::acceptor* acceptor);
  void RunIoThread();
};

int ReservedConnections(int max_connections) { return std::clamp(max_connections / 10, 1, 64); }

void HttpFrontEnd::Impl::Accept(tcp::acceptor* acceptor) {
  if (AtReserveLimit()) {
    // New connections wait in the listen queue; look again when one may have closed.
    auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
    timer->async_wait([this, acceptor, timer](boost::system::error_code ec) {
      if (!ec) Accept(acceptor);
    });
    return;
  }
  acceptor->async_accept(net::make_strand(ioc), [this, acceptor](boost::system::error_code ec,
                                                                 tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;  // Stop()
      // Out of descriptors and the like: keep accepting, after a pause that lets them free.
      if (options.log) {
        options.log(absl::StrCat(options.name, ": accept failed: ", ec.message()));
      }
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
      timer->async_wait([this, acceptor, timer](boost::system::error_code) { Accept(acceptor); });
      return;
    }
    const HttpSessionKind kind =
        AtConnectionLimit() ? HttpSessionKind::kReserved : HttpSessionKind::kAll;
    StartHttpSession(std::move(socket), &context, kind);
    Accept(acceptor);
  });
}

void HttpFrontEnd::Impl::RunIoThread() {
  // A handler that throws unwinds out of run(); the connection it served is closed with its
  // handler's state, and the thread goes on serving the others.
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      if (options.log) options.log(absl::StrCat(options.name, ": I/O thread caught: ", e.what()));
    } catch (...) {
      if (options.log)
        options.log(absl::StrCat(options.name, ": I/O thread caught an unknown exception"));
    }
  }
}

absl::StatusOr<std::unique_ptr<HttpFrontEnd>> HttpFrontEnd::Start(HttpFrontEndOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  if (impl->options.handler == nullptr) {
    return absl::InvalidArgumentError("an HTTP front end needs a handler");
  }
  impl->context.handler = impl->options.handler.get();
  impl->context.counts = &impl->counts;
  impl->context.max_body_bytes = impl->options.max_body_bytes;
  impl->context.idle_timeout = impl->options.idle_timeout;
  impl->context.header_timeout = impl->options.header_timeout;
  impl->context.body_timeout = impl->options.body_timeout;
  impl->context.write_timeout = impl->options.write_timeout;
  impl->context.reserved_path = impl->options.reserved_path;
  impl->context.limit_name = impl->options.limit_name.empty()
                                 ? absl::StrCat("--max-connections ", impl->options.max_connections)
                                 : impl->options.limit_name;
  impl->context.background = impl->background.get();
  impl->context.log = impl->options.log;
  if (impl->options.listen.kind != ListenAddress::Kind::kTcp) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", impl->options.name, " listener takes TCP addresses only"));
  }
  absl::StatusOr<ListenSockets> sockets =
      Listen(impl->options.listen, net::socket_base::max_listen_connections);
  if (!sockets.ok()) {
    return absl::UnavailableError(
        absl::StrCat(sockets.status().message(), " (", impl->options.name, ")"));
  }
  impl->port = sockets->port;
  for (size_t i = 0; i < sockets->fds.size(); ++i) {
    const int fd = sockets->fds[i];
    SocketAddress bound;
    bound.length = sizeof(bound.storage);
    getsockname(fd, bound.get(), &bound.length);
    auto acceptor = std::make_unique<tcp::acceptor>(impl->ioc);
    boost::system::error_code ec;
    acceptor->assign(bound.family() == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) {
      for (size_t j = i; j < sockets->fds.size(); ++j) close(sockets->fds[j]);
      return absl::UnavailableError(absl::StrCat("cannot listen on ",
                                                 impl->options.listen.WithPort(impl->port), " (",
                                                 impl->options.name, "): ", ec.message()));
    }
    impl->acceptors.push_back(std::move(acceptor));
  }
  for (const std::unique_ptr<tcp::acceptor>& a : impl->acceptors) impl->Accept(a.get());
  const int threads = std::max(1, impl->options.threads);
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([p = impl.get()] { p->RunIoThread(); });
  }
  return std::unique_ptr<HttpFrontEnd>(new HttpFrontEnd(std::move(impl)));
}

HttpFrontEnd::HttpFrontEnd(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpFrontEnd::~HttpFrontEnd() { Stop(); }

int HttpFrontEnd::port() const { return impl_->port; }

int64_t HttpFrontEnd::open_connections() const { return impl_->counts.open_connections(); }

int64_t HttpFrontEnd::live_completions() const { return impl_->counts.live_completions(); }

bool HttpFrontEnd::WaitForNoCompletions(absl::Duration timeout) {
  return impl_->counts.WaitForNoCompletions(timeout);
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
  boost::system::error_code ignored;
  for (const std::unique_ptr<tcp::acceptor>& a : impl_->acceptors) a->close(ignored);
}

}  // namespace prefixd
