#include "server/connection_acceptor.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace prefixd {
namespace {

// Connections waiting to be accepted while at the limit: the kernel caps it at somaxconn.
constexpr int kListenBacklog = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ConnectionAcceptor::Listen(
    const ListenAddress& address) {
  std::unique_ptr<ConnectionAcceptor> a(new ConnectionAcceptor());
  a->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (a->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen: eventfd: ", strerror(errno)));
  }
  absl::StatusOr<ListenSockets> sockets = prefixd::Listen(address, kListenBacklog);
  if (!sockets.ok()) return sockets.status();
  a->listen_fds_ = std::move(sockets->fds);
  a->port_ = sockets->port;
  a->unix_ = address.kind != ListenAddress::Kind::kTcp;
  if (address.kind == ListenAddress::Kind::kUnix) a->unix_path_ = address.path;
  return a;
}

ConnectionAcceptor::~ConnectionAcceptor() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ConnectionAcceptor::Start(Handoff handoff, int max_connections,
                               std::function<void(std::string_view)> log) {
  handoff_ = std::move(handoff);
  max_connections_ = max_connections;
  log_ = std::move(log);
  thread_ = std::thread([this] { Loop(); });
}

void ConnectionAcceptor::Stop() {
  if (!stopping_.exchange(true)) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      // The eventfd cannot be full; the loop also wakes once a second to look.
    }
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : listen_fds_) close(fd);
  listen_fds_.clear();
  if (!unix_path_.empty()) {
    unlink(unix_path_.c_str());
    unix_path_.clear();
  }
}

bool ConnectionAcceptor::WaitForStop(int timeout_ms) {
  pollfd p{wake_fd_, POLLIN, 0};
  poll(&p, 1, timeout_ms);
  return stopping_.load();
}

void ConnectionAcceptor::Sweep() {
  for (auto it = handed_.begin(); it != handed_.end();) {
    struct stat st;
    const bool same =
        fstat(it->first, &st) == 0 && st.st_dev == it->second.dev && st.st_ino == it->second.ino;
    if (same) {
      ++it;
    } else {
      handed_.erase(it++);
    }
  }
  open_.store(static_cast<int>(handed_.size()));
}

void ConnectionAcceptor::Loop() {
  std::vector<pollfd> fds;
  for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_fd_, POLLIN, 0});
  absl::Time last_sweep = absl::InfinitePast();
  bool at_limit_logged = false;
  bool out_of_fds_logged = false;
  while (!stopping_.load()) {
    const bool at_limit = static_cast<int>(handed_.size()) >= max_connections_;
    if (absl::Now() - last_sweep >= (at_limit ? absl::Milliseconds(50) : absl::Seconds(1))) {
      Sweep();
      last_sweep = absl::Now();
    }
    if (static_cast<int>(handed_.size()) >= max_connections_) {
      if (!at_limit_logged) {
        log_(absl::StrCat("connection limit reached (", max_connections_,
                          ", --max-connections): new connections wait until one closes"));
        at_limit_logged = true;
      }
      WaitForStop(50);
      continue;
    }
    at_limit_logged = false;
    for (pollfd& p : fds) p.revents = 0;
    if (poll(fds.data(), fds.size(), 1000) <= 0) continue;
    for (size_t i = 0; i + 1 < fds.size() && !stopping_.load(); ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      const int fd = accept4(fds[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          if (!out_of_fds_logged) {
            log_(absl::StrCat("cannot accept a connection (", strerror(errno),
                              "): retrying every 100 ms until descriptors are free"));
            out_of_fds_logged = true;
          }
          Sweep();
          last_sweep = absl::Now();
          WaitForStop(100);
        }
        continue;  // EAGAIN, ECONNABORTED, EINTR, ...: nothing to do
      }
      out_of_fds_logged = false;
      struct stat st;
      if (fstat(fd, &st) != 0) {
        close(fd);
        continue;
      }
      if (!unix_) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      // A descriptor number reused since gRPC closed it: the old connection is gone.
      handed_[fd] = SocketId{st.st_dev, st.st_ino};
      open_.store(static_cast<int>(handed_.size()));
      handoff_(fds[i].fd, fd);
    }
  }
}

}  // namespace prefixd
