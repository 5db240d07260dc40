// The one reading of a listen address, for every flag that takes one (--listen,
// --http-listen, --metrics-listen): "HOST:PORT", "[IPV6]:PORT", and for the gRPC port also
// "unix:PATH" / "unix:///PATH" and "unix-abstract:NAME". A TCP address means every socket
// address HOST resolves to (an empty HOST, or "0.0.0.0" / "[::]", is every interface);
// port 0 asks the kernel for a free port, which every socket of the address then shares.
#ifndef PREFIXD_SERVER_LISTEN_ADDRESS_H_
#define PREFIXD_SERVER_LISTEN_ADDRESS_H_

#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prefixd {

struct ListenAddress {
  enum class Kind { kTcp, kUnix, kUnixAbstract };
  Kind kind = Kind::kTcp;
  std::string host;  // kTcp: without brackets; empty for every interface
  int port = 0;      // kTcp: 0..65535
  std::string path;  // kUnix: the socket's path; kUnixAbstract: its name

  // "HOST:PORT" with `port` in place of this one's (brackets around an IPv6 host), as logs
  // and URLs show it.
  std::string WithPort(int port) const;
};

enum class UnixSockets { kAllow, kRefuse };

// INVALID_ARGUMENT naming `flag` ("--http-listen") and the forms it takes.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view text,
                                                 UnixSockets unix_sockets);

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  void set_port(int port);
  std::string ToString() const;  // "127.0.0.1:80", "[::1]:80"
};

// Every socket address a kTcp address names (getaddrinfo with AI_PASSIVE), in the resolver's
// order; INVALID_ARGUMENT naming `flag` when the host does not resolve.
absl::StatusOr<std::vector<SocketAddress>> ResolveListenAddress(absl::string_view flag,
                                                                const ListenAddress& address);

// Listening sockets (non-blocking, close-on-exec, SO_REUSEADDR, no SO_REUSEPORT: a port
// another process holds is refused) on every socket address of `address`; with port 0 the
// first socket picks the port and the others take it too. A resolved address this machine
// lacks (::1 without IPv6) is skipped; a port in use is not. A unix socket file left by an
// earlier server is replaced; any other file at the path is not. UNAVAILABLE naming the
// address and the reason.
struct ListenSockets {
  std::vector<int> fds;  // owned by the caller
  int port = 0;          // the bound port; 0 for a unix socket
};
absl::StatusOr<ListenSockets> Listen(const ListenAddress& address, int backlog);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_LISTEN_ADDRESS_H_
