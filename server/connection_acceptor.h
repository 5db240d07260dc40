// The gRPC port's accept loop, owned by prefixd instead of gRPC.
//
// gRPC 1.51's own loop stops for good after one failed accept4() (EMFILE when the process
// is out of descriptors): the port then never accepts again. It also has no connection
// limit. This loop listens itself, accepts while fewer than `max_connections` connections
// are open (the rest wait in the kernel's listen queue), retries after a failed accept
// (EMFILE, ENFILE, ENOBUFS, ENOMEM) instead of giving up, and hands each connection's
// descriptor to gRPC, which owns it from then on.
//
// Counting open connections: gRPC closes a descriptor when its connection ends and says
// nothing. Each handed-over descriptor is remembered with the identity of its socket
// (device and inode, unique while the socket exists); a remembered descriptor whose fstat
// fails or names another socket has been closed. The loop checks them at most every 50 ms
// while at the limit and once a second otherwise.
#ifndef PREFIXD_SERVER_CONNECTION_ACCEPTOR_H_
#define PREFIXD_SERVER_CONNECTION_ACCEPTOR_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/listen_address.h"

namespace prefixd {

class ConnectionAcceptor {
 public:
  // Gives an accepted connection to gRPC. `listener_fd` is the socket it was accepted on.
  using Handoff = std::function<void(int listener_fd, int fd)>;

  // Binds and listens on `address` (server/listen_address.h: every address a TCP host
  // resolves to, or a unix socket). Nothing is accepted before Start.
  static absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> Listen(const ListenAddress& address);
  ~ConnectionAcceptor();  // Stop()s

  ConnectionAcceptor(const ConnectionAcceptor&) = delete;
  ConnectionAcceptor& operator=(const ConnectionAcceptor&) = delete;

  int port() const { return port_; }  // 0 for a unix socket
  bool unix_socket() const { return unix_; }

  // Accepts on a thread of its own until Stop. `log` gets the loop's rare lines (limit
  // reached, out of descriptors), each at most once per episode.
  void Start(Handoff handoff, int max_connections, std::function<void(std::string_view)> log);
  // Stops accepting and closes the listening sockets; connections already handed over stay
  // with gRPC. Idempotent.
  void Stop();

  // Connections handed over that are still open, as of the loop's last check.
  int open_connections() const { return open_.load(); }

 private:
  ConnectionAcceptor() = default;
  void Loop();
  // Forgets the handed-over descriptors that have been closed since.
  void Sweep();
  // Waits up to `timeout_ms` for Stop; true if stopping.
  bool WaitForStop(int timeout_ms);

  struct SocketId {
    dev_t dev;
    ino_t ino;
  };

  std::vector<int> listen_fds_;
  int wake_fd_ = -1;  // an eventfd that Stop writes
  int port_ = 0;
  bool unix_ = false;
  std::string unix_path_;  // removed by Stop (not for abstract sockets)
  Handoff handoff_;
  int max_connections_ = 0;
  std::function<void(std::string_view)> log_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  absl::flat_hash_map<int, SocketId> handed_;  // loop thread only
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_CONNECTION_ACCEPTOR_H_
