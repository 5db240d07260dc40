// prefixd::Server: the composition root as a library. It loads the model, builds the backend
// (or takes one from an injected factory), the engine, the request path and its front ends
// (gRPC with health and reflection, HTTP), and the Prometheus exposer; serves until BeginDrain;
// and stops them in order. `prefixd` (server/main.cc) is this class plus flags and signals;
// tests run it in-process on a fake backend.
//
// Life: Start() returns once every listener accepts calls (or an error naming what failed,
// with nothing left running). BeginDrain(grace) turns health NOT_SERVING, refuses new calls
// with UNAVAILABLE, and lets queued and running requests go on until `grace` ends; calling
// it again can only shorten the grace. Wait() returns when everything has stopped. A fatal
// backend error drains the server by itself (with `shutdown_grace`), and Wait() returns it.
#ifndef PREFIXD_SERVER_SERVER_H_
#define PREFIXD_SERVER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "server/adapter_registry.h"

namespace prefixd {

class Executor;
class InferenceService;
class RequestPath;

// Where the backend comes from when no factory is given (the --device ... flags).
struct DeviceOptions {
  std::string device = "auto";  // auto | cpu | cuda
  std::string dtype = "auto";   // auto | f32 | f16 | bf16
  int64_t kv_cache_bytes = 0;   // 0 = the backend's default budget
  int32_t block_size = 16;
  int32_t threads = 0;  // CPU backend threads; 0 = all cores
};

// Every field mirrors the `prefixd` flag of the same name (docs/SERVER.md), and errors name
// the flag.
struct ServerOptions {
  std::string model_dir;
  // Builds the backend for the loaded model; unset = the backend `device` describes.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const Model&)> backend_factory;
  DeviceOptions device;
  int32_t max_batch_tokens = 512;
  int32_t max_queue = 1024;
  int32_t max_samples = 16;
  bool enable_prefix_cache = true;
  // LoRA adapters served by name (--adapter, --max-adapters).
  AdapterOptions adapters;
  // Second cache tier on local disk (empty: none); cap in bytes (0: the smaller of 8 GiB and
  // half the free space of its filesystem at start-up).
  std::string cache_dir;
  int64_t cache_dir_bytes = 0;
  // Shared cache tier on Redis (empty: none): redis://HOST:PORT[/DB] or unix:///path; the
  // password (if the server wants one) is the first line of kv_remote_password_file; every key
  // starts with kv_remote_prefix; kv_remote_timeout bounds each connect and command.
  std::string kv_remote;
  std::string kv_remote_password_file;
  std::string kv_remote_prefix = "prefixd:";
  absl::Duration kv_remote_timeout = absl::Milliseconds(20);
  // Listeners. Port 0 picks a free port (see grpc_address()/metrics_port()); `unix:PATH`
  // serves gRPC on a unix socket; metrics_listen "off" serves no /metrics.
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";
  // The OpenAI-compatible HTTP API (server/http_front_end.h); "off" serves none.
  std::string http_listen = "127.0.0.1:8000";
  std::string auth_tokens_file;  // empty: every call is the default tenant
  std::string tls_cert_file;     // with tls_key_file: gRPC serves TLS
  std::string tls_key_file;
  bool reflection = true;  // gRPC server reflection (needs no token; see docs/SERVER.md)
  // Open gRPC connections accepted at once; 0 = what RLIMIT_NOFILE leaves (docs/SERVER.md).
  int32_t max_connections = 0;
  // A gRPC connection without calls this long is closed (GOAWAY).
  absl::Duration connection_idle_timeout = absl::Seconds(300);
  // The grace of a drain the server starts itself (after a fatal backend error).
  absl::Duration shutdown_grace = absl::Seconds(30);
  // Start-up and shutdown log lines; unset = stderr, prefixed "prefixd: ".
  std::function<void(std::string_view)> log;
};

// The option checks Start() makes first, before anything slow: each error names its flag
// and the value given. Exposed so that main can check its flags the same way.
absl::Status ValidateServerOptions(const ServerOptions& options);

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  // Drains with no grace if nobody did, waits, and releases everything.
  ~Server();

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Does not block (may be called from any thread, a signal watcher included).
  void BeginDrain(absl::Duration grace);
  // Re-reads --auth-tokens and the TLS certificate and key (SIGHUP). Each that reads and
  // checks cleanly replaces the one in use: new tokens are accepted and removed ones refused
  // from the next call on, and new TLS handshakes use the new pair within ~1 s; calls and
  // connections already open go on. One that fails keeps what was in use, is logged, and
  // its reason is in the returned error. Any thread.
  absl::Status Reload();

  // Blocks until the drain has finished: OK, or the fatal backend error that ended serving.
  absl::Status Wait();

  bool draining() const;
  // "HOST:PORT" with the port actually bound, or the `unix:` address as given.
  const std::string& grpc_address() const;
  int grpc_port() const;     // 0 for a unix socket
  int metrics_port() const;  // 0 when metrics are off
  int http_port() const;     // 0 when the HTTP API is off
  bool tls() const;

  const Model& model() const;
  Engine& engine();

 private:
  friend class ServerTestPeer;  // tests/server/server_test_peer.h
  struct Parts;
  explicit Server(std::unique_ptr<Parts> parts);

  // The parts a test peer observes.
  InferenceService& grpc_service();
  RequestPath& request_path();
  Executor& grpc_pumps();

  std::unique_ptr<Parts> parts_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_SERVER_H_
