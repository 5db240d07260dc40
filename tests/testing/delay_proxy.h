// A TCP proxy in front of a test's server (a redis-server) that passes on what the client
// sends at once and what the server answers late: every chunk `delay` after it came (a
// server slow to answer), and at most `chunk_bytes` at a time with `gap` between sends when
// a gap is set (a slow link: replies trickle in, each piece well within a command timeout).
// Any number of connections, each on a thread of its own. Header-only; for tests and
// benchmark programs.
#ifndef PREFIXD_TESTS_TESTING_DELAY_PROXY_H_
#define PREFIXD_TESTS_TESTING_DELAY_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/check.h"

namespace prefixd::testing {

class DelayProxy {
 public:
  struct Options {
    absl::Duration delay = absl::ZeroDuration();
    size_t chunk_bytes = 64 << 10;
    absl::Duration gap = absl::ZeroDuration();
  };

  DelayProxy(int server_port, const Options& options)
      : server_port_(server_port), options_(options) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(0);
    PREFIXD_CHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    PREFIXD_CHECK(listen(listen_fd_, 64) == 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~DelayProxy() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (std::thread& t : connections_) t.join();
    close(listen_fd_);
  }
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  int port() const { return port_; }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void Accept() {
    while (!stop_) {
      pollfd p{.fd = listen_fd_, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      std::lock_guard<std::mutex> l(mu_);
      connections_.emplace_back([this, client] { Relay(client); });
    }
  }

  void Relay(int client) {
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(server_port_);
    PREFIXD_CHECK(connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    struct Held {
      absl::Time due;
      std::string bytes;
    };
    std::deque<Held> held;
    absl::Time next_send = absl::InfinitePast();
    std::vector<char> buf(1 << 20);
    bool open = true;
    while (!stop_ && open) {
      // Wake for the next chunk that falls due, or every 50 ms to see stop_.
      absl::Duration wait = absl::Milliseconds(50);
      if (!held.empty()) {
        wait = std::clamp(std::max(held.front().due, next_send) - absl::Now(), absl::ZeroDuration(),
                          wait);
      }
      pollfd p[2] = {{.fd = client, .events = POLLIN, .revents = 0},
                     {.fd = server, .events = POLLIN, .revents = 0}};
      const int ready = poll(
          p, 2,
          static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1)))));
      if (ready > 0 && p[0].revents != 0) {
        const ssize_t n = read(client, buf.data(), buf.size());
        if (n <= 0) break;
        open = write(server, buf.data(), static_cast<size_t>(n)) == n;
      }
      if (ready > 0 && p[1].revents != 0) {
        const ssize_t n = read(server, buf.data(), buf.size());
        if (n <= 0) break;
        held.push_back(
            {absl::Now() + options_.delay, std::string(buf.data(), static_cast<size_t>(n))});
      }
      while (open && !held.empty() && held.front().due <= absl::Now() && next_send <= absl::Now()) {
        Held& h = held.front();
        const size_t n = std::min(h.bytes.size(), options_.chunk_bytes);
        open = ::send(client, h.bytes.data(), n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
        h.bytes.erase(0, n);
        if (h.bytes.empty()) held.pop_front();
        if (options_.gap > absl::ZeroDuration()) next_send = absl::Now() + options_.gap;
      }
    }
    close(client);
    close(server);
  }

  const int server_port_;
  const Options options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> connections_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_TESTING_DELAY_PROXY_H_
