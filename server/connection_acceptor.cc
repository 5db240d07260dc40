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

absl::Status ListenError(const std::string& address, std::string_view why) {
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", address, ": ", absl::string_view(why.data(), why.size())));
}

absl::StatusOr<int> ListenUnix(const std::string& address, const std::string& path, bool abstract) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t offset = abstract ? 1 : 0;  // an abstract name starts with a NUL byte
  if (path.empty() || path.size() + offset >= sizeof(addr.sun_path)) {
    return ListenError(address, absl::StrCat("the socket path must be 1 to ",
                                             sizeof(addr.sun_path) - 1 - offset, " bytes"));
  }
  std::memcpy(addr.sun_path + offset, path.data(), path.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + offset +
                                               path.size() + (abstract ? 0 : 1));
  if (!abstract) {
    // A socket file left by an earlier server is replaced, as gRPC does; any other file is not.
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ListenError(address, strerror(errno));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, kListenBacklog) != 0) {
    const int err = errno;
    close(fd);
    return ListenError(address, strerror(err));
  }
  return fd;
}

// "host:port" or "[v6]:port" into host and port; false if it is neither.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (absl::StartsWith(*host, "[")) {
    if (host->size() < 2 || host->back() != ']') return false;
    *host = host->substr(1, host->size() - 2);
  } else if (host->find(':') != std::string::npos) {
    return false;  // an IPv6 address needs brackets
  }
  int p = 0;
  return absl::SimpleAtoi(*port, &p) && p >= 0 && p <= 65535;
}

int BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SetPort(sockaddr* addr, int port) {
  if (addr->sa_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (addr->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ConnectionAcceptor::Listen(
    const std::string& address) {
  std::unique_ptr<ConnectionAcceptor> a(new ConnectionAcceptor());
  a->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (a->wake_fd_ < 0) return ListenError(address, strerror(errno));
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    const bool abstract = absl::StartsWith(address, "unix-abstract:");
    std::string path = address.substr(address.find(':') + 1);
    if (!abstract && absl::StartsWith(path, "//")) path = path.substr(2);  // unix:///abs/path
    absl::StatusOr<int> fd = ListenUnix(address, path, abstract);
    if (!fd.ok()) return fd.status();
    a->listen_fds_.push_back(*fd);
    a->unix_ = true;
    if (!abstract) a->unix_path_ = path;
    return a;
  }
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    return ListenError(address, "expected HOST:PORT, [IPV6]:PORT, unix:PATH or unix-abstract:NAME");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return ListenError(address, gai_strerror(rc));
  }
  std::string first_error;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    // Port 0: the first socket picks one, the others (e.g. ::1 after 127.0.0.1) take it too.
    if (a->port_ != 0) SetPort(ai->ai_addr, a->port_);
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restart over TIME_WAIT
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, kListenBacklog) != 0) {
      if (first_error.empty()) first_error = strerror(errno);
      close(fd);
      // Another address of the name that this machine lacks (::1 without IPv6) is skipped;
      // a port in use is not.
      if (errno == EADDRINUSE || a->listen_fds_.empty()) {
        freeaddrinfo(found);
        return ListenError(address, first_error);
      }
      continue;
    }
    if (a->port_ == 0) a->port_ = BoundPort(fd);
    a->listen_fds_.push_back(fd);
  }
  freeaddrinfo(found);
  if (a->listen_fds_.empty()) {
    return ListenError(address, first_error.empty() ? "no address to bind" : first_error);
  }
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
