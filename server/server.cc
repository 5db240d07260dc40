#include "server/server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/file.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_posix.h"
#include "server/auth.h"
#include "server/backend_factory.h"
#include "server/connection_acceptor.h"
#include "server/executor.h"
#include "server/http_front_end.h"
#include "server/http_router.h"
#include "server/inference_service.h"
#include "server/listen_address.h"
#include "server/malformed_request_interceptor.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/rate_limited_log.h"
#include "server/request_path.h"
#include "server/tls_identity.h"

namespace prefixd {
namespace {

// The tenants the per-tenant metrics name (ServerOptions::metrics_tenants): the first `n` of
// the tokens file, or the one tenant there is without a file.
std::vector<std::string> TenantLabels(const Authenticator& auth, int32_t n) {
  if (!auth.enabled()) return {std::string(kDefaultTenant)};
  std::vector<std::string> out;
  for (const TenantPolicy& p : auth.policies()) {
    if (static_cast<int32_t>(out.size()) >= n) break;
    out.push_back(p.name);
  }
  return out;
}

void LogToStderr(std::string_view line) {
  std::fprintf(stderr, "prefixd: %.*s\n", static_cast<int>(line.size()), line.data());
  std::fflush(stderr);
}

// The addresses each listener takes, read once from the options (server/listen_address.h).
struct ServerListenAddresses {
  ListenAddress grpc;
  std::optional<ListenAddress> http;     // nullopt: "off"
  std::optional<ListenAddress> metrics;  // nullopt: "off"
};

absl::StatusOr<ServerListenAddresses> ParseServerListenAddresses(const ServerOptions& o) {
  ServerListenAddresses out;
  absl::StatusOr<ListenAddress> grpc =
      ParseListenAddress("--listen", o.listen, UnixSockets::kAllow);
  if (!grpc.ok()) return grpc.status();
  out.grpc = *std::move(grpc);
  for (auto [flag, text, field] :
       {std::tuple<const char*, const std::string*, std::optional<ListenAddress>*>{
            "--http-listen", &o.http_listen, &out.http},
        {"--metrics-listen", &o.metrics_listen, &out.metrics}}) {
    if (*text == "off") continue;
    absl::StatusOr<ListenAddress> a = ParseListenAddress(flag, *text, UnixSockets::kRefuse);
    if (!a.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(a.status().message(), " (\"off\" disables it)"));
    }
    *field = *std::move(a);
  }
  return out;
}

// A pump is short (poll, decode a few tokens, build one message, StartWrite); a few threads
// keep one call that is slow to lock its reactor from holding up the others.
constexpr int kGrpcPumpThreads = 4;

// Requests to the metrics listener have no body worth reading.
constexpr size_t kMetricsMaxBodyBytes = 4096;

// How long a new gRPC connection may take to complete its TLS and HTTP/2 handshakes (gRPC's
// default), or the idle timeout when that is shorter.
constexpr int64_t kHandshakeTimeoutMs = 120000;

// Descriptors kept for everything but gRPC connections: the model's files, the metrics
// listener's connections (kMetricsMaxConnections and its reserve), gRPC's and CUDA's own
// descriptors, the log.
constexpr int64_t kReservedDescriptors = 128;
// The derived connection limit's ceiling: each connection costs gRPC memory too.
constexpr int64_t kMaxDerivedConnections = 16384;

// --max-connections, or its default from RLIMIT_NOFILE: what the limit leaves once
// kReservedDescriptors are set aside, up to kMaxDerivedConnections.
absl::StatusOr<int> ResolveMaxConnections(int32_t flag) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return absl::InternalError("getrlimit failed");
  const int64_t limit =
      rl.rlim_cur == RLIM_INFINITY ? int64_t{1} << 30 : static_cast<int64_t>(rl.rlim_cur);
  const int64_t usable = limit - kReservedDescriptors;
  if (usable < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the descriptor limit (RLIMIT_NOFILE) is ", limit, ": prefixd needs more than ",
        kReservedDescriptors, " (raise it with ulimit -n)"));
  }
  if (flag == 0) return static_cast<int>(std::min(usable, kMaxDerivedConnections));
  if (flag > usable) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-connections ", flag, " is more than the descriptor limit (RLIMIT_NOFILE ", limit,
        ") leaves for connections: use at most ", usable, ", or raise the limit (ulimit -n)"));
  }
  return static_cast<int>(flag);
}

// Keeps the reflection plugin (initialised for the whole process) off one server.
class ReflectionOff : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    for (auto it = plugins->begin(); it != plugins->end();) {
      if ((*it)->name() == "proto_server_reflection") {
        it = plugins->erase(it);
      } else {
        ++it;
      }
    }
  }
};

// The checks of the server's own options (ServerOptions, server/server.h: each lower layer
// checks its own when it is built), made once, first in Start, before anything slow: each
// error names its flag and the value given.
absl::Status ValidateServerOptions(const ServerOptions& o) {
  using absl::InvalidArgumentError;
  using absl::StrCat;
  if (o.model_dir.empty()) return InvalidArgumentError("--model DIR is required");
  if (!o.kv_remote_password_file.empty() && o.engine.remote_tier.url.empty()) {
    return InvalidArgumentError("--kv-remote-password-file needs --kv-remote");
  }
  if (o.shutdown_grace < absl::ZeroDuration()) {
    return InvalidArgumentError(StrCat("--shutdown-grace must not be negative, got ",
                                       absl::FormatDuration(o.shutdown_grace)));
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (o.max_connections < 0) {
    return InvalidArgumentError(
        StrCat("--max-connections must be 0 (derived from the descriptor limit) or positive, got ",
               o.max_connections));
  }
  if (absl::Status s = ValidateAdapterOptions(o.adapters); !s.ok()) return s;
  if (o.request_header_timeout <= absl::ZeroDuration() ||
      o.request_header_timeout > absl::Minutes(10)) {
    return InvalidArgumentError(
        StrCat("--request-header-timeout must be above 0 and at most 10m, got ",
               absl::FormatDuration(o.request_header_timeout)));
  }
  if (o.request_body_timeout <= absl::ZeroDuration() ||
      o.request_body_timeout > absl::Minutes(10)) {
    return InvalidArgumentError(
        StrCat("--request-body-timeout must be above 0 and at most 10m, got ",
               absl::FormatDuration(o.request_body_timeout)));
  }
  if (o.response_write_timeout <= absl::ZeroDuration() ||
      o.response_write_timeout > absl::Minutes(10)) {
    return InvalidArgumentError(
        StrCat("--response-write-timeout must be above 0 and at most 10m, got ",
               absl::FormatDuration(o.response_write_timeout)));
  }
  if (absl::Status s = ValidateKvEventsOptions(o.kv_events); !s.ok()) return s;
  if (o.connection_idle_timeout <= absl::ZeroDuration()) {
    return InvalidArgumentError(StrCat("--connection-idle-timeout must be positive, got ",
                                       absl::FormatDuration(o.connection_idle_timeout)));
  }
  return absl::OkStatus();
}

}  // namespace

// Everything the server owns, declared in the order it is built: members are destroyed in
// reverse, so the metrics listener stops scraping before the engine goes, the gRPC server stops
// before its service, the engine before the backend, the backend before the model.
struct Server::Parts {
  ServerOptions options;
  std::function<void(std::string_view)> log;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const Authenticator> auth =
      std::make_shared<Authenticator>(Authenticator::AllowAll());
  std::unique_ptr<TlsIdentity> tls_identity;  // with --tls-cert
  // Pumps of the gRPC Generate reactors. Built before the engine, whose notifies post here,
  // so it is destroyed after the engine has stopped.
  std::unique_ptr<Executor> grpc_pumps = std::make_unique<Executor>(kGrpcPumpThreads);
  // With --kv-events; built before the engine, which publishes into it.
  std::shared_ptr<KvEventPublisher> kv_events;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<AdapterRegistry> adapters;
  std::shared_ptr<ServerMetrics> metrics;
  std::unique_ptr<RequestPath> path;
  std::unique_ptr<InferenceService> service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> external_acceptor;
  std::unique_ptr<ConnectionAcceptor> acceptor;  // null for TLS on a unix socket
  int max_connections = 0;  // resolved from --max-connections and RLIMIT_NOFILE
  std::unique_ptr<HttpFrontEnd> http;
  std::unique_ptr<HttpFrontEnd> metrics_http;  // the metrics listener
  ServerListenAddresses listen;                // parsed from the options by Build
  std::string grpc_address;
  int grpc_port = 0;
  int metrics_port = 0;
  int http_port = 0;
  bool tls = false;

  absl::Mutex mu;
  bool drain_started ABSL_GUARDED_BY(mu) = false;
  absl::Status fatal ABSL_GUARDED_BY(mu);
  std::thread drain_thread;  // started once, by the first BeginDrain
  absl::Notification stopped;
  absl::Mutex join_mu;    // one Wait() joins the drain thread
  absl::Mutex reload_mu;  // one Reload() at a time

  ~Parts() {
    // A drain thread still running would use what is destroyed below.
    absl::MutexLock lock(&join_mu);
    if (drain_thread.joinable()) drain_thread.join();
  }

  void BeginDrain(absl::Duration grace) {
    absl::MutexLock lock(&mu);
    engine->BeginShutdown(grace);  // only ever shortens the grace
    if (drain_started) return;
    drain_started = true;
    if (grpc_server != nullptr) grpc_server->GetHealthCheckService()->SetServingStatus(false);
    path->StartDraining();
    drain_thread = std::thread([this] { DrainAndStop(); });
  }

  void DrainAndStop() {
    engine->Shutdown(absl::InfiniteDuration());  // BeginDrain set the grace; waits for it
    log("engine stopped");
    if (grpc_server != nullptr) {
      // Reactors now only flush their last messages; a client that stopped reading is cut
      // off. Waited for here rather than in Shutdown: gRPC 1.51's Shutdown can sit out its
      // whole deadline after the last call ended (seen with clients that keep their
      // connection).
      if (!service->WaitForNoGenerates(absl::Seconds(5))) log("cutting off calls still writing");
      if (acceptor != nullptr) acceptor->Stop();
      grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    }
    if (http != nullptr) {
      // The same for HTTP responses still being written; then every connection closes.
      if (!http->WaitForNoCompletions(absl::Seconds(5))) log("cutting off HTTP responses");
      http->Stop();
    }
    // Joins its I/O thread, so no scrape reads the engine once it is gone.
    if (metrics_http != nullptr) metrics_http->Stop();
    stopped.Notify();
  }

  void OnFatalError(const absl::Status& status) {
    log(absl::StrCat("fatal backend error, shutting down: ", status.message()));
    {
      absl::MutexLock lock(&mu);
      fatal = status;
    }
    BeginDrain(options.shutdown_grace);
  }

  absl::Status Build();
  absl::Status Reload();
  absl::Status StartMetrics();
  absl::Status StartGrpc(const std::shared_ptr<grpc::ServerCredentials>& creds);
  absl::Status StartHttp();
};

absl::Status Server::Parts::Build() {
  // Cheap checks first: the descriptor budget, the TLS files and tokens are read (and the
  // TLS pair checked) before the model loads, so a typo in them costs no model load (or CUDA
  // probe).
  absl::StatusOr<ServerListenAddresses> addresses = ParseServerListenAddresses(options);
  if (!addresses.ok()) return addresses.status();
  listen = *std::move(addresses);
  if (options.metrics_tenants < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-tenants must be >= 0, got ", options.metrics_tenants));
  }
  absl::StatusOr<int> max_conn = ResolveMaxConnections(options.max_connections);
  if (!max_conn.ok()) return max_conn.status();
  max_connections = *max_conn;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::unique_ptr<TlsIdentity>> id =
        TlsIdentity::Create(options.tls_cert_file, options.tls_key_file);
    if (!id.ok()) return id.status();
    tls_identity = *std::move(id);
    creds = tls_identity->credentials();
    tls = true;
  }
  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(options.auth_tokens_file);
    if (!a.ok()) return a.status();
    auth = std::make_shared<Authenticator>(*std::move(a));
  }

  // Probing CUDA initialises its runtime (seconds without a GPU): only when it may be used.
  DevicePlan plan;
  if (!options.backend_factory) {
    const std::string& device = options.device.device;
    const absl::Status cuda_usable = device == "cuda"   ? CudaUsable()
                                     : device == "auto" ? CudaUsableForAuto()
                                                        : absl::UnavailableError("not probed");
    absl::StatusOr<DevicePlan> p = PlanDevice(device, options.device.dtype, cuda_usable);
    if (!p.ok()) return p.status();
    plan = *std::move(p);
    if (!plan.note.empty()) log(plan.note);
  }

  absl::StatusOr<std::unique_ptr<Model>> loaded = Model::Load(options.model_dir);
  if (!loaded.ok()) return loaded.status();
  model = *std::move(loaded);
  const ModelConfig& config = model->config();
  log(absl::StrFormat("model %s: %d layers, %d heads, n_embd %d, vocab %d, context %d",
                      model->name(), config.n_layer, config.n_head, config.n_embd,
                      config.vocab_size, config.n_positions));
  log(absl::StrCat("manifest sha256 ", model->manifest_sha256()));

  absl::StatusOr<std::unique_ptr<Backend>> built;
  if (options.backend_factory) {
    built = options.backend_factory(*model);
  } else {
    built = CreateBackend(*model, options.device, plan, log);
  }
  if (!built.ok()) {
    return absl::Status(built.status().code(), absl::StrCat("backend: ", built.status().message()));
  }
  backend = *std::move(built);
  log(absl::StrCat("device ", backend->device_name(), ", dtype ",
                   std::string(DTypeName(backend->dtype()))));
  log(absl::StrFormat("KV pool: %d blocks x %d tokens, %d bytes per token, %d bytes",
                      backend->num_blocks(), backend->block_size(), backend->kv_bytes_per_token(),
                      backend->memory_usage().kv_pool_bytes));

  EngineOptions eopt = options.engine;  // the operator's; the wiring is set here
  eopt.backend = backend.get();
  eopt.tenants = auth->policies();  // the --auth-tokens file's weight=, share=, max_waiting=
  eopt.model_config = config;
  eopt.manifest_sha256 = model->manifest_sha256();
  if (!eopt.remote_tier.url.empty()) {
    RemoteTierOptions& r = eopt.remote_tier;
    if (!options.kv_remote_password_file.empty()) {
      absl::StatusOr<std::string> pw = ReadWholeFile(options.kv_remote_password_file);
      if (!pw.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("--kv-remote-password-file ",
                                                          options.kv_remote_password_file, ": ",
                                                          pw.status().message()));
      }
      r.password = pw->substr(0, pw->find_first_of("\r\n"));
      if (r.password.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("--kv-remote-password-file ", options.kv_remote_password_file,
                         ": the first line is empty (it must hold the password)"));
      }
    }
    // One line per 10 s at most: a Redis that is down fails every admission's match.
    auto faults = std::make_shared<RateLimitedLog>(
        RateLimitedLog::Options{.sink = [sink = log](std::string_view line) { sink(line); },
                                .interval = absl::Seconds(10)});
    r.log = [faults](const std::string& line) { faults->Write(line); };
  }
  if (!options.kv_events.endpoint.empty()) {
    absl::StatusOr<std::shared_ptr<KvEventPublisher>> p =
        KvEventPublisher::Start(options.kv_events);
    if (!p.ok()) return p.status();
    kv_events = *std::move(p);
    eopt.kv_events = kv_events;
    log(absl::StrCat("kv events on ", kv_events->endpoint(),
                     kv_events->replay_endpoint().empty()
                         ? std::string(" (no replay)")
                         : absl::StrCat(", replay on ", kv_events->replay_endpoint()),
                     options.kv_events.topic.empty()
                         ? std::string()
                         : absl::StrCat(", topic '", options.kv_events.topic, "'"),
                     ", ", options.kv_events.buffer_batches, " batches kept for replay"));
  }
  // From the engine thread: BeginDrain does not block, so the engine can stop afterwards.
  eopt.on_fatal_error = [this](const absl::Status& status) { OnFatalError(status); };
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(eopt);
  if (!e.ok())
    return absl::Status(e.status().code(), absl::StrCat("engine: ", e.status().message()));
  engine = *std::move(e);
  if (!eopt.enable_prefix_cache) log("prefix cache disabled (--no-prefix-cache)");
  if (!eopt.disk_tier.dir.empty()) {
    const DiskTierStats d = engine->Stats().disk;
    log(absl::StrFormat(
        "disk cache %s: %d blocks of this model (%d bytes on disk, %d files of other models), "
        "cap %d bytes%s",
        eopt.disk_tier.dir, d.blocks, d.bytes, d.foreign_files, d.cap_bytes,
        eopt.disk_tier.max_bytes > 0 ? " (--cache-dir-bytes)"
                                     : " (the smaller of 8 GiB and half the free space)"));
  }
  if (!eopt.remote_tier.url.empty()) {
    const RemoteTierStats r = engine->Stats().remote;
    log(absl::StrCat("remote cache ", eopt.remote_tier.url, " (keys ", eopt.remote_tier.key_prefix,
                     "*): ", r.up ? "up" : "not reached yet; counted and retried with backoff"));
  }
  if (auth->enabled()) {
    log(absl::StrCat("bearer tokens required (", auth->num_tokens(), " tokens)"));
  }
  adapters = std::make_shared<AdapterRegistry>(
      AdapterRegistryOptions{.base_name = model->name(),
                             .base = config,
                             .max_adapters = options.adapters.max_adapters,
                             .backend_applies_lora = backend->applies_lora(),
                             .backend_name = backend->device_name(),
                             .load_hook = options.adapters.load_hook});
  for (const std::string& flag : options.adapters.adapters) {
    absl::StatusOr<std::pair<std::string, std::string>> parsed = ParseAdapterFlag(flag);
    if (!parsed.ok()) return parsed.status();
    absl::StatusOr<AdapterInfo> a = adapters->Load(parsed->first, parsed->second);
    if (!a.ok()) {
      return absl::Status(a.status().code(),
                          absl::StrCat("--adapter ", flag, ": ", a.status().message()));
    }
    log(absl::StrFormat("adapter %s: %s, rank %d, alpha %g, %d bytes, sha256 %s", a->name, a->dir,
                        a->rank, a->lora_alpha, a->memory_bytes, a->digest));
  }

  Engine* eng = engine.get();
  Backend* be = backend.get();
  AdapterRegistry* reg = adapters.get();
  metrics = std::make_shared<ServerMetrics>(MetricsSources{
      .stats = [eng] { return eng->Stats(); },
      .latencies = [eng] { return eng->DrainLatencies(); },
      .memory = [be] { return be->memory_usage(); },
      .adapter_bytes = [reg] { return reg->memory_bytes(); },
      .adapter_tokens = [eng] { return eng->DrainAdapterTokens(); },
      .adapter_names =
          [reg] {
            std::vector<std::string> names;
            for (const AdapterInfo& a : reg->List()) names.push_back(a.name);
            return names;
          },
      .base_name = model->name(),
      .tenant_labels = TenantLabels(*auth, options.metrics_tenants),
      .kv_events = kv_events == nullptr
                       ? std::function<std::pair<uint64_t, uint64_t>()>()
                       : [ev = kv_events.get()] {
                           return std::pair<uint64_t, uint64_t>{ev->published(), ev->dropped()};
                         }});
  if (absl::Status s = StartMetrics(); !s.ok()) return s;

  RequestPathOptions popt;
  popt.engine = eng;
  popt.tokenizer = &model->tokenizer();
  popt.auth = auth;
  popt.metrics = metrics.get();
  popt.adapters = adapters;
  popt.model = ServedModel{.name = model->name(),
                           .manifest_sha256 = model->manifest_sha256(),
                           .config = config,
                           .dtype = std::string(DTypeName(backend->dtype())),
                           .device = backend->device_name(),
                           .kv_pool = backend->kv_pool()};
  path = std::make_unique<RequestPath>(std::move(popt));
  service = std::make_unique<InferenceService>(path.get(), grpc_pumps.get(),
                                               options.response_write_timeout);
  if (absl::Status s = StartGrpc(creds); !s.ok()) return s;
  return StartHttp();
}

absl::Status Server::Parts::StartHttp() {
  if (!listen.http.has_value()) return absl::OkStatus();
  HttpFrontEndOptions hopt;
  hopt.listen = *listen.http;
  hopt.handler = std::make_unique<HttpRouter>(path.get(), absl::ToUnixSeconds(absl::Now()));
  hopt.idle_timeout = options.connection_idle_timeout;
  hopt.header_timeout = options.request_header_timeout;
  hopt.body_timeout = options.request_body_timeout;
  hopt.write_timeout = options.response_write_timeout;
  hopt.threads = options.http_threads;
  // The same limit as gRPC's, for each front end; a descriptor shortage in between only
  // delays accepts (both loops retry).
  hopt.max_connections = max_connections;
  hopt.log = log;
  absl::StatusOr<std::unique_ptr<HttpFrontEnd>> h = HttpFrontEnd::Start(std::move(hopt));
  if (!h.ok()) return h.status();
  http = *std::move(h);
  http_port = http->port();
  log(absl::StrCat("http on http://", listen.http->WithPort(http_port)));
  if (!path->Authorize(std::nullopt).ok()) return absl::OkStatus();  // tokens required
  if (adapters != nullptr && backend->applies_lora()) {
    log(
        absl::StrCat("warning: no --auth-tokens: every client is admin, so anyone who reaches "
                     "http://",
                     listen.http->WithPort(http_port),
                     " (or the gRPC port) can load LoRA adapters from directories on this host "
                     "and unload them (POST /v1/load_lora_adapter); give --auth-tokens with an "
                     "admin column to restrict that"));
  }
  return absl::OkStatus();
}

absl::Status Server::Parts::Reload() {
  std::vector<std::string> failed;
  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(options.auth_tokens_file);
    // The policies go to the engine first: one it refuses keeps the previous tokens too.
    const absl::Status s = a.ok() ? engine->SetTenantPolicies(a->policies()) : a.status();
    if (s.ok()) {
      const size_t n = a->num_tokens();
      metrics->SetTenantLabels(TenantLabels(*a, options.metrics_tenants));
      path->SetAuthenticator(std::make_shared<Authenticator>(*std::move(a)));
      log(absl::StrCat("reload: ", n, " bearer tokens from ", options.auth_tokens_file));
    } else {
      failed.push_back(std::string(s.message()));
      log(absl::StrCat("reload: keeping the previous tokens: ", s.message()));
    }
  }
  if (tls_identity != nullptr) {
    if (absl::Status s = tls_identity->Reload(); s.ok()) {
      log(absl::StrCat("reload: TLS certificate ", options.tls_cert_file, " and key ",
                       options.tls_key_file, " (new connections use them within ~1 s)"));
    } else {
      failed.push_back(std::string(s.message()));
      log(absl::StrCat("reload: keeping the previous TLS certificate and key: ", s.message()));
    }
  }
  if (options.auth_tokens_file.empty() && tls_identity == nullptr) {
    log("reload: nothing to reload (no --auth-tokens, no --tls-cert)");
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(failed, "; "));
}

absl::Status Server::Parts::StartMetrics() {
  if (!listen.metrics.has_value()) return absl::OkStatus();
  HttpFrontEndOptions mopt;
  mopt.listen = *listen.metrics;
  mopt.handler = std::make_unique<MetricsEndpoint>(metrics.get());
  mopt.name = "metrics";
  mopt.threads = 1;  // a scrape takes milliseconds; connections wait on no thread
  mopt.max_body_bytes = kMetricsMaxBodyBytes;
  mopt.idle_timeout = options.connection_idle_timeout;
  mopt.header_timeout = options.request_header_timeout;
  mopt.body_timeout = options.request_body_timeout;
  mopt.write_timeout = options.response_write_timeout;
  mopt.max_connections = kMetricsMaxConnections;
  mopt.reserved_path = "/metrics";
  mopt.limit_name = absl::StrCat(kMetricsMaxConnections, " metrics connections");
  mopt.log = log;
  absl::StatusOr<std::unique_ptr<HttpFrontEnd>> m = HttpFrontEnd::Start(std::move(mopt));
  if (!m.ok()) return m.status();
  metrics_http = *std::move(m);
  metrics_port = metrics_http->port();
  log(absl::StrCat("metrics on http://", listen.metrics->WithPort(metrics_port), "/metrics"));
  return absl::OkStatus();
}

absl::Status Server::Parts::StartGrpc(const std::shared_ptr<grpc::ServerCredentials>& creds) {
  grpc::EnableDefaultHealthCheckService(true);
  // The plugin is process-wide once initialised; each builder then asks it whether to add
  // reflection.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.reflection) {
    builder.SetOption(std::make_unique<ReflectionOff>());
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedRequestInterceptorFactory>(metrics.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // A connection without calls for the idle timeout gets a GOAWAY and is closed; one that
  // never completes its TLS or HTTP/2 handshake is closed after the handshake timeout.
  const int64_t idle_ms = absl::ToInt64Milliseconds(options.connection_idle_timeout);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(std::min<int64_t>(idle_ms, INT32_MAX)));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(std::min<int64_t>(idle_ms, kHandshakeTimeoutMs)));
  const bool unix_socket = listen.grpc.kind != ListenAddress::Kind::kTcp;
  // prefixd accepts itself (server/connection_acceptor.h) everywhere but TLS on a unix
  // socket: TCP connections go to gRPC through an external connection acceptor (plaintext
  // or TLS), unix ones through AddInsecureChannelFromFd (gRPC 1.51's external acceptor
  // drops unix peers, whose address is unnamed).
  const bool own_accept = !(unix_socket && tls);
  if (own_accept) {
    absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> a = ConnectionAcceptor::Listen(listen.grpc);
    if (!a.ok()) return a.status();
    acceptor = *std::move(a);
    if (!unix_socket) {
      external_acceptor = builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
    }
  } else {
    // gRPC sets SO_REUSEPORT by default on Linux: a second prefixd on a busy port would then
    // start and take half of the first one's new connections. Refuse the port instead.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.AddListeningPort(options.listen, creds, &grpc_port);
  }
  builder.RegisterService(service.get());
  grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || (!own_accept && grpc_port == 0)) {
    grpc_server.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  grpc_server->GetHealthCheckService()->SetServingStatus(true);
  if (own_accept) {
    ConnectionAcceptor::Handoff handoff;
    if (unix_socket) {
      grpc::Server* server = grpc_server.get();
      handoff = [server](int, int fd) { grpc::AddInsecureChannelFromFd(server, fd); };
    } else {
      grpc::experimental::ExternalConnectionAcceptor* external = external_acceptor.get();
      handoff = [external](int listener_fd, int fd) {
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
        p.listener_fd = listener_fd;
        p.fd = fd;
        external->HandleNewConnection(&p);
      };
    }
    acceptor->Start(std::move(handoff), max_connections, log);
    grpc_port = acceptor->port();
  }
  // A unix socket address has no port to report (gRPC sets `grpc_port` to 1 for it).
  if (unix_socket) {
    grpc_address = options.listen;
    grpc_port = 0;
  } else {
    grpc_address = listen.grpc.WithPort(grpc_port);
  }
  // Scripts read the port from this line: it ends with the address (or " (TLS)").
  log(absl::StrCat("listening on ", grpc_address, tls ? " (TLS)" : ""));
  log(absl::StrCat(own_accept ? absl::StrCat("at most ", max_connections, " gRPC connections")
                              : std::string("no gRPC connection limit (TLS on a unix socket)"),
                   ", idle ones closed after ",
                   absl::FormatDuration(options.connection_idle_timeout)));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (absl::Status s = ValidateServerOptions(options); !s.ok()) return s;
  // A client can make protobuf log a line per request (invalid UTF-8 in a string field).
  RouteProtobufLogThroughRateLimit();
  auto parts = std::make_unique<Parts>();
  parts->log = options.log ? options.log : LogToStderr;
  parts->options = std::move(options);
  if (absl::Status s = parts->Build(); !s.ok()) {
    // Nothing was accepted: stop what was built, at once.
    if (parts->engine != nullptr && parts->path != nullptr) {
      parts->BeginDrain(absl::ZeroDuration());
      parts->stopped.WaitForNotification();
    } else if (parts->metrics_http != nullptr) {
      parts->metrics_http->Stop();
    }
    return s;
  }
  return std::unique_ptr<Server>(new Server(std::move(parts)));
}

Server::Server(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

Server::~Server() {
  BeginDrain(absl::ZeroDuration());
  Wait().IgnoreError();
}

void Server::BeginDrain(absl::Duration grace) { parts_->BeginDrain(grace); }

absl::Status Server::Reload() {
  absl::MutexLock lock(&parts_->reload_mu);
  return parts_->Reload();
}

absl::Status Server::Wait() {
  parts_->stopped.WaitForNotification();
  {
    absl::MutexLock lock(&parts_->join_mu);
    if (parts_->drain_thread.joinable()) parts_->drain_thread.join();
  }
  absl::MutexLock lock(&parts_->mu);
  return parts_->fatal;
}

bool Server::draining() const { return parts_->path->draining(); }
const std::string& Server::grpc_address() const { return parts_->grpc_address; }
int Server::grpc_port() const { return parts_->grpc_port; }
int Server::metrics_port() const { return parts_->metrics_port; }
int Server::http_port() const { return parts_->http_port; }
std::string Server::kv_events_endpoint() const {
  return parts_->kv_events != nullptr ? parts_->kv_events->endpoint() : std::string();
}
std::string Server::kv_events_replay_endpoint() const {
  return parts_->kv_events != nullptr ? parts_->kv_events->replay_endpoint() : std::string();
}
bool Server::tls() const { return parts_->tls; }
const Model& Server::model() const { return *parts_->model; }
Engine& Server::engine() { return *parts_->engine; }
InferenceService& Server::grpc_service() { return *parts_->service; }
RequestPath& Server::request_path() { return *parts_->path; }
Executor& Server::grpc_pumps() { return *parts_->grpc_pumps; }

}  // namespace prefixd
