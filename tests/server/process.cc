#include "tests/server/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/random_model.h"

namespace prefixd::testing {

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The child dies with the test process.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    // The test binary may block signals on its threads; the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  auto p = std::unique_ptr<Process>(new Process());
  p->pid_ = pid;
  p->reader_ = std::thread([proc = p.get(), fd = fds[0]] { proc->ReadLoop(fd); });
  return p;
}

void Process::ReadLoop(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    absl::MutexLock l(&mu_);
    output_.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  absl::MutexLock l(&mu_);
  eof_ = true;
}

Process::~Process() {
  if (!exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (reader_.joinable()) reader_.join();
}

void Process::Signal(int sig) { kill(pid_, sig); }

std::optional<int> Process::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return exit_code_;
  {
    // The pipe reaches EOF when the child (its only writer) exits.
    absl::MutexLock l(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&eof_), timeout)) return std::nullopt;
  }
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) return std::nullopt;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (reader_.joinable()) reader_.join();
  return exit_code_;
}

std::optional<std::string> Process::WaitForLine(const std::string& needle, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  size_t pos = std::string::npos;
  auto found = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pos = output_.find(needle);
    if (pos == std::string::npos) return eof_;
    return output_.find('\n', pos) != std::string::npos || eof_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&found), timeout);
  if (pos == std::string::npos) return std::nullopt;
  const size_t start = output_.rfind('\n', pos);
  const size_t begin = start == std::string::npos ? 0 : start + 1;
  const size_t end = output_.find('\n', pos);
  return output_.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string Process::Output() const {
  absl::MutexLock l(&mu_);
  return output_;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "prefixd-test-XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  path_ = p != nullptr ? std::string(p) : std::string();
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

absl::Status WriteTinyModel(const std::string& dir) {
  RandomModelOptions opt;
  opt.out_dir = dir;
  opt.tokenizer_dir = PREFIXD_TOKENIZER_DIR;
  opt.config = TinyModelConfig();
  opt.seed = 7;
  return WriteRandomModel(opt);
}

std::string BuiltBinary(const std::string& relative) {
  return absl::StrCat(PREFIXD_BINARY_DIR, "/", relative);
}

namespace {

int PortAfter(const std::string& line, const std::string& marker) {
  size_t pos = line.find(marker);
  if (pos == std::string::npos) return 0;
  pos += marker.size();
  size_t end = pos;
  while (end < line.size() && isdigit(static_cast<unsigned char>(line[end]))) ++end;
  int port = 0;
  if (!absl::SimpleAtoi(line.substr(pos, end - pos), &port)) return 0;
  return port;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& model_dir, const std::vector<std::string>& extra_flags) {
  std::vector<std::string> argv = {BuiltBinary("server/prefixd"),
                                   "--model",
                                   model_dir,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--metrics-listen",
                                   "127.0.0.1:0",
                                   "--http-listen",
                                   "127.0.0.1:0",
                                   "--device",
                                   "cpu",
                                   "--threads",
                                   "1"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> proc = Process::Start(argv);
  if (!proc.ok()) return proc.status();
  auto server = std::unique_ptr<ServerProcess>(new ServerProcess());
  server->process_ = *std::move(proc);
  std::optional<std::string> metrics =
      server->process_->WaitForLine("metrics on http://127.0.0.1:", absl::Seconds(30));
  std::optional<std::string> listening =
      server->process_->WaitForLine("listening on 127.0.0.1:", absl::Seconds(30));
  // The HTTP API starts last: once it is up, prefixd serves everything.
  std::optional<std::string> http =
      server->process_->WaitForLine("http on http://127.0.0.1:", absl::Seconds(30));
  if (!metrics.has_value() || !listening.has_value() || !http.has_value()) {
    return absl::InternalError(
        absl::StrCat("prefixd did not start; its output:\n", server->process_->Output()));
  }
  server->metrics_port_ = PortAfter(*metrics, "metrics on http://127.0.0.1:");
  server->port_ = PortAfter(*listening, "listening on 127.0.0.1:");
  server->http_port_ = PortAfter(*http, "http on http://127.0.0.1:");
  server->address_ = absl::StrCat("127.0.0.1:", server->port_);
  return server;
}

absl::Status SuiteServer::Prepare() {
  if (dir_ != nullptr) return absl::OkStatus();
  dir_ = std::make_unique<TempDir>();
  return WriteTinyModel(model_dir());
}

absl::Status SuiteServer::Start(const std::vector<std::string>& flags) {
  if (absl::Status s = Prepare(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(model_dir(), flags);
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  return absl::OkStatus();
}

void SuiteServer::Stop() {
  server_.reset();
  dir_.reset();
}

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  CommandResult r;
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(argv);
  if (!p.ok()) {
    r.output = std::string(p.status().message());
    return r;
  }
  std::optional<int> code = (*p)->Wait(timeout);
  r.exit_code = code.value_or(-1);
  r.output = (*p)->Output();
  return r;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (timeout != absl::InfiniteDuration()) {
    const timeval tv = absl::ToTimeval(timeout);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::InternalError("write failed");
  }
  std::string resp;
  char buf[8192];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat("no answer from 127.0.0.1:", port, " within ",
                                                      absl::FormatDuration(timeout)));
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat("no answer from 127.0.0.1:", port, " within ",
                                                      absl::FormatDuration(timeout)));
    }
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("bad HTTP response: ", resp.substr(0, 200)));
  }
  const std::string status_line = resp.substr(0, resp.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("HTTP ", status_line));
  }
  return resp.substr(body + 4);
}

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool PollUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (done()) return true;
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace prefixd::testing
