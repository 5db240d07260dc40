// Test helpers that run real processes: prefixd (parsing its start-up log for the ports it
// picked), prefixctl and other commands. Everything a helper starts is stopped by its
// destructor, so a failing test leaves no process behind.
#ifndef PREFIXD_TESTS_SERVER_PROCESS_H_
#define PREFIXD_TESTS_SERVER_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace prefixd::testing {

// A child process whose stdout and stderr are captured together, line by line.
class Process {
 public:
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv);
  ~Process();  // SIGKILLs the child if it still runs, and reaps it

  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // The exit code (128 + signal when killed by one), or nullopt if still running at `timeout`.
  std::optional<int> Wait(absl::Duration timeout);
  // Waits until some output line contains `needle`; returns that line.
  std::optional<std::string> WaitForLine(const std::string& needle, absl::Duration timeout);
  std::string Output() const;

 private:
  Process() = default;
  void ReadLoop(int fd);

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::thread reader_;
  mutable absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
};

// A unique temporary directory, removed with its contents by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes the tiny random model (tools/random_model.h) into `dir`.
absl::Status WriteTinyModel(const std::string& dir);

// A fixture whose tests share one tiny model, written once per suite: dir_ (a temporary
// directory, removed after the suite) and model_ (the model directory inside it).
class TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_ = dir_->path() + "/model";
    ASSERT_TRUE(WriteTinyModel(model_).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_;
};

// Path of a binary built in this build tree (PREFIXD_BINARY_DIR/<relative>).
std::string BuiltBinary(const std::string& relative);

// prefixd on 127.0.0.1 with OS-chosen gRPC and metrics ports.
class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& model_dir, const std::vector<std::string>& extra_flags);
  std::string address() const { return address_; }  // "127.0.0.1:PORT"
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }
  Process& process() { return *process_; }

 private:
  std::unique_ptr<Process> process_;
  std::string address_;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
};

// One prefixd shared by a whole test suite: the tiny model in a temporary directory and the
// server on it. SetUpTestSuite calls Start (or Prepare, writes files the flags will name into
// dir(), then Start); TearDownTestSuite calls Stop, which kills prefixd and removes dir().
class SuiteServer {
 public:
  // Makes dir() and writes the tiny model into model_dir(). Idempotent.
  absl::Status Prepare();
  // Prepare()s if needed, then starts prefixd on model_dir() with `flags` added.
  absl::Status Start(const std::vector<std::string>& flags);
  void Stop();

  const std::string& dir() const { return dir_->path(); }  // after Prepare
  std::string model_dir() const { return dir() + "/tiny-model"; }
  ServerProcess* server() const { return server_.get(); }  // null unless started

 private:
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<ServerProcess> server_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs a command to completion (killed after `timeout`).
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(60));

// A minimal HTTP/1.0 GET against 127.0.0.1:port: the body, or an error (DEADLINE_EXCEEDED
// when the server sends nothing for `timeout`).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path,
                                    absl::Duration timeout = absl::InfiniteDuration());

// A TCP connection to 127.0.0.1:port (the caller closes it), or -1.
int ConnectLoopback(int port);

// A port that was free a moment ago (bind to 0, read it, close) for programs that cannot
// report the port they picked.
int PickFreePort();

// Polls `done` every 20 ms until it holds or `timeout` passes. Only for state that another
// process changes without telling us (an engine step, a Prometheus scrape).
bool PollUntil(const std::function<bool()>& done, absl::Duration timeout);

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_SERVER_PROCESS_H_
