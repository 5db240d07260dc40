// prefixd::Server: the composition root as a library. It loads the model, builds the backend
// (or takes one from an injected factory), the engine, the request path and its front ends
// (gRPC with health and reflection, HTTP), and the metrics listener; serves until BeginDrain;
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
#include "server/backend_factory.h"
#include "server/kv_events.h"

namespace prefixd {

class Executor;
class InferenceService;
class RequestPath;

// Every option is a `prefixd` flag (docs/SERVER.md), held by the layer that reads it and
// checked once, by that layer, with an error that names the flag:
//   ServerOptions          the listeners, auth, TLS, connections, shutdown: Server::Start,
//                          before anything slow
//   ├─ device              DeviceOptions (server/backend_factory.h): --device and --dtype by
//   │  │                   PlanDevice, --threads by the CPU backend
//   │  └─ kv_pool          KvPoolOptions (cache/kv_pool.h): --kv-cache-bytes, --block-size, by
//   │                      the backend that allocates the pool
//   ├─ kv_events          KvEventsOptions (server/kv_events.h): --kv-events*, by Server::Start
//   ├─ adapters           AdapterOptions (server/adapter_registry.h): --adapter, --max-adapters
//   └─ engine             EngineOptions (engine/engine_options.h): --max-batch-tokens,
//      │                   --max-queue, --max-samples, --no-prefix-cache, by Engine::Create
//      ├─ disk_tier        DiskTierOptions: --cache-dir, --cache-dir-bytes, by DiskTier::Open
//      └─ remote_tier      RemoteTierOptions: --kv-remote, --kv-remote-prefix,
//                          --kv-remote-timeout, by RemoteTier::Open
// The engine's wiring (backend, model_config, manifest_sha256, on_fatal_error) is the
// server's to set; whatever `engine` holds there is replaced. Options of a lower layer are
// checked when that layer is built, so after the model has loaded.
struct ServerOptions {
  std::string model_dir;
  // Builds the backend for the loaded model; unset = the backend `device` describes.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const Model&)> backend_factory;
  DeviceOptions device;
  EngineOptions engine;
  // LoRA adapters served by name (--adapter, --max-adapters).
  AdapterOptions adapters;
  // --kv-remote-password-file: the remote tier's password is this file's first line (read at
  // start-up into engine.remote_tier.password; never in the URL, which `ps` shows).
  std::string kv_remote_password_file;
  // --kv-events, --kv-events-replay, --kv-events-topic, --kv-events-buffer: the KV event
  // stream for cache-aware routers (server/kv_events.h); off while kv_events.endpoint is empty.
  KvEventsOptions kv_events;
  // Listeners. Port 0 picks a free port (see grpc_address()/metrics_port()); `unix:PATH`
  // serves gRPC on a unix socket; metrics_listen "off" serves no /metrics.
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";
  // The OpenAI-compatible HTTP API (server/http_front_end.h); "off" serves none.
  std::string http_listen = "127.0.0.1:8000";
  std::string auth_tokens_file;  // empty: every call is the default tenant
  // --metrics-tenants: the per-tenant series carry the names of the first this many tenants
  // of the --auth-tokens file (or "default" without one); the rest are summed as "other".
  int32_t metrics_tenants = 16;
  std::string tls_cert_file;  // with tls_key_file: gRPC serves TLS
  std::string tls_key_file;
  bool reflection = true;  // gRPC server reflection (needs no token; see docs/SERVER.md)
  // Open gRPC connections accepted at once; 0 = what RLIMIT_NOFILE leaves (docs/SERVER.md).
  int32_t max_connections = 0;
  // A gRPC connection without calls this long is closed (GOAWAY).
  absl::Duration connection_idle_timeout = absl::Seconds(300);
  // I/O threads of the HTTP front end.
  int32_t http_threads = 2;
  // HTTP and metrics: from a request's first byte to the end of its header (slowloris).
  absl::Duration request_header_timeout = absl::Seconds(2);
  // HTTP and metrics: from the end of a request's header to the end of its body.
  absl::Duration request_body_timeout = absl::Seconds(60);
  // A client that takes none of an answer's bytes for this long (it stopped reading) is cut
  // off: over HTTP (and metrics) the completion is cancelled and the connection closed; a gRPC
  // Generate call is cancelled.
  absl::Duration response_write_timeout = absl::Seconds(60);
  // The grace of a drain the server starts itself (after a fatal backend error).
  absl::Duration shutdown_grace = absl::Seconds(30);
  // Start-up and shutdown log lines; unset = stderr, prefixed "prefixd: ".
  std::function<void(std::string_view)> log;
};

// The metrics listener's connection limit (Prometheus keeps one connection per target);
// ReservedConnections (server/http_front_end.h) of it more serve only /metrics.
inline constexpr int kMetricsMaxConnections = 64;

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
  // The KV event sockets as bound (wildcard ports resolved); "" when off.
  std::string kv_events_endpoint() const;
  std::string kv_events_replay_endpoint() const;
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
