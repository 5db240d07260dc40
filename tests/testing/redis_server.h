// A real redis-server (the Debian package) for the remote-tier tests: started on 127.0.0.1 at
// a free port (and a unix socket) in a temporary directory, with persistence off, and killed
// by the destructor. Header-only: links hiredis (PkgConfig::HIREDIS) for Command().
#ifndef PREFIXD_TESTS_TESTING_REDIS_SERVER_H_
#define PREFIXD_TESTS_TESTING_REDIS_SERVER_H_

#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace prefixd::testing {

class RedisServer {
 public:
  // `extra` are redis-server options ("--maxmemory", "1mb", ...).
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(std::vector<std::string> extra = {}) {
    std::unique_ptr<RedisServer> s(new RedisServer());
    s->extra_ = std::move(extra);
    char tmpl[] = "/tmp/prefixd-redis-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
    s->dir_ = tmpl;
    if (absl::Status st = s->Launch(PickPort()); !st.ok()) return st;
    return s;
  }
  ~RedisServer() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int port() const { return port_; }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }
  std::string socket_path() const { return dir_ + "/redis.sock"; }
  std::string unix_url() const { return "unix://" + socket_path(); }

  // SIGKILL, as a crash: no shutdown, nothing saved.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: a server that accepts nothing and answers nothing, as a hung one.
  void Pause() { ::kill(pid_, SIGSTOP); }
  void Resume() { ::kill(pid_, SIGCONT); }
  // A new, empty server on the same port and socket.
  absl::Status Restart() {
    Kill();
    return Launch(port_);
  }

  // One command over a fresh connection; the reply as text (integers in decimal, nil as
  // "(nil)", errors as "ERR ..."), for the tests to read and change what the tier stored.
  std::string Command(const std::vector<std::string>& args) const {
    redisContext* c = redisConnect("127.0.0.1", port_);
    if (c == nullptr || c->err != 0) {
      if (c != nullptr) redisFree(c);
      return "(no connection)";
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string out = "(no reply)";
    if (r != nullptr) {
      out = Text(r);
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }

 private:
  RedisServer() = default;

  static std::string Text(const redisReply* r) {
    switch (r->type) {
      case REDIS_REPLY_STRING:
      case REDIS_REPLY_STATUS:
        return std::string(r->str, r->len);
      case REDIS_REPLY_ERROR:
        return "ERR " + std::string(r->str, r->len);
      case REDIS_REPLY_INTEGER:
        return std::to_string(r->integer);
      case REDIS_REPLY_NIL:
        return "(nil)";
      case REDIS_REPLY_ARRAY: {
        std::string s;
        for (size_t i = 0; i < r->elements; ++i) s += (i ? "\n" : "") + Text(r->element[i]);
        return s;
      }
    }
    return "(unknown)";
  }

  static int PickPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    const int port = ntohs(a.sin_port);
    ::close(fd);
    return port;
  }

  absl::Status Launch(int port) {
    port_ = port;
    std::vector<std::string> args = {"redis-server", "--bind", "127.0.0.1", "--port",
                                     std::to_string(port), "--unixsocket", socket_path(),
                                     "--unixsocketperm", "700", "--save", "", "--appendonly",
                                     "no", "--dir", dir_, "--logfile", dir_ + "/redis.log"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      return absl::FailedPreconditionError(
          "cannot start redis-server: install the Debian package redis-server (scripts/setup)");
    }
    for (int i = 0; i < 200; ++i) {  // up to 10 s
      // PONG, or NOAUTH from a server that wants a password: either way it answers.
      const std::string pong = Command({"PING"});
      if (pong == "PONG" || pong.rfind("ERR NOAUTH", 0) == 0) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Kill();
    return absl::DeadlineExceededError(absl::StrCat("redis-server did not answer on port ", port));
  }

  std::vector<std::string> extra_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_TESTING_REDIS_SERVER_H_
