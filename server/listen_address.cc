#include "server/listen_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

absl::Status Malformed(absl::string_view flag, absl::string_view text, UnixSockets unix_sockets) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", text, " is not an address: expected HOST:PORT or [IPV6]:PORT",
                   unix_sockets == UnixSockets::kAllow ? ", unix:PATH or unix-abstract:NAME" : "",
                   " (PORT 0 to 65535)"));
}

std::string Bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
}

std::string Describe(const ListenAddress& a) {
  switch (a.kind) {
    case ListenAddress::Kind::kUnix:
      return absl::StrCat("unix:", a.path);
    case ListenAddress::Kind::kUnixAbstract:
      return absl::StrCat("unix-abstract:", a.path);
    case ListenAddress::Kind::kTcp:
      break;
  }
  return a.WithPort(a.port);
}

absl::Status ListenError(const ListenAddress& address, absl::string_view why) {
  return absl::UnavailableError(absl::StrCat("cannot listen on ", Describe(address), ": ", why));
}

absl::StatusOr<int> ListenUnix(const ListenAddress& address, int backlog) {
  const bool abstract = address.kind == ListenAddress::Kind::kUnixAbstract;
  const std::string& path = address.path;
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
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ListenError(address, strerror(errno));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, backlog) != 0) {
    const int err = errno;
    close(fd);
    return ListenError(address, strerror(err));
  }
  return fd;
}

int BoundPort(int fd) {
  SocketAddress s;
  s.length = sizeof(s.storage);
  if (getsockname(fd, s.get(), &s.length) != 0) return 0;
  if (s.family() == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&s.storage)->sin_port);
  if (s.family() == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&s.storage)->sin6_port);
  }
  return 0;
}

}  // namespace

std::string ListenAddress::WithPort(int p) const { return absl::StrCat(Bracketed(host), ":", p); }

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view text,
                                                 UnixSockets unix_sockets) {
  ListenAddress a;
  const bool unix_form = absl::StartsWith(text, "unix:");
  const bool abstract_form = absl::StartsWith(text, "unix-abstract:");
  if (unix_form || abstract_form) {
    if (unix_sockets == UnixSockets::kRefuse) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", text, ": this port takes HOST:PORT only, not a unix socket"));
    }
    a.kind = abstract_form ? ListenAddress::Kind::kUnixAbstract : ListenAddress::Kind::kUnix;
    a.path = std::string(text.substr(text.find(':') + 1));
    if (unix_form && absl::StartsWith(a.path, "//")) a.path = a.path.substr(2);  // unix:///abs
    if (a.path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", text, ": the unix socket needs a path or name"));
    }
    return a;
  }
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return Malformed(flag, text, unix_sockets);
  absl::string_view host = text.substr(0, colon);
  if (absl::StartsWith(host, "[")) {
    if (host.size() < 2 || host.back() != ']') return Malformed(flag, text, unix_sockets);
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return Malformed(flag, text, unix_sockets);  // an IPv6 address needs brackets
  }
  const absl::string_view port = text.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), absl::ascii_isdigit);
  if (!digits || !absl::SimpleAtoi(port, &a.port) || a.port > 65535) {
    return Malformed(flag, text, unix_sockets);
  }
  a.host = std::string(host);
  return a;
}

void SocketAddress::set_port(int port) {
  if (storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (storage.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

std::string SocketAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(in6->sin6_port));
  }
  return "?";
}

absl::StatusOr<std::vector<SocketAddress>> ResolveListenAddress(absl::string_view flag,
                                                                const ListenAddress& address) {
  if (address.kind != ListenAddress::Kind::kTcp) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": a unix socket has no IP address"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (const int rc = getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(),
                                 port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", address.WithPort(address.port),
                     ": cannot resolve the host: ", gai_strerror(rc)));
  }
  std::vector<SocketAddress> out;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress s;
    std::memcpy(&s.storage, ai->ai_addr, ai->ai_addrlen);
    s.length = ai->ai_addrlen;
    out.push_back(s);
  }
  freeaddrinfo(found);
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", address.WithPort(address.port), ": the host has no address"));
  }
  return out;
}

absl::StatusOr<ListenSockets> Listen(const ListenAddress& address, int backlog) {
  ListenSockets out;
  if (address.kind != ListenAddress::Kind::kTcp) {
    absl::StatusOr<int> fd = ListenUnix(address, backlog);
    if (!fd.ok()) return fd.status();
    out.fds.push_back(*fd);
    return out;
  }
  absl::StatusOr<std::vector<SocketAddress>> resolved = ResolveListenAddress("listen", address);
  if (!resolved.ok()) return ListenError(address, resolved.status().message());
  const auto close_all = [&out] {
    for (int fd : out.fds) close(fd);
    out.fds.clear();
  };
  // A name that resolves to both families (an empty host, "localhost") gets a socket for
  // each, so the IPv6 one must not also claim the IPv4 port; "[::]" alone stays dual-stack.
  const bool has_ipv4 = std::any_of(resolved->begin(), resolved->end(),
                                    [](const SocketAddress& s) { return s.family() == AF_INET; });
  std::string first_error;
  for (SocketAddress& s : *resolved) {
    if (out.port != 0) s.set_port(out.port);
    const int fd = socket(s.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restart over TIME_WAIT
    if (s.family() == AF_INET6 && has_ipv4) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    if (bind(fd, s.get(), s.length) != 0 || listen(fd, backlog) != 0) {
      const int err = errno;
      if (first_error.empty()) first_error = strerror(err);
      close(fd);
      if (err == EADDRINUSE || out.fds.empty()) {
        close_all();
        return ListenError(address, first_error);
      }
      continue;
    }
    if (out.port == 0) out.port = BoundPort(fd);
    out.fds.push_back(fd);
  }
  if (out.fds.empty()) {
    return ListenError(address, first_error.empty() ? "no address to bind" : first_error);
  }
  return out;
}

}  // namespace prefixd
