// prefixd: the gRPC inference server. The composition root: it loads the model, picks the
// backend, starts the engine, the gRPC server (Inference, health, reflection) and the
// Prometheus exposer, then waits for SIGTERM/SIGINT and drains (docs/SERVER.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CivetServer.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/read_file.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "server/auth.h"
#include "server/backend_factory.h"
#include "server/flag_names.h"
#include "server/inference_service.h"
#include "server/metrics.h"

ABSL_FLAG(std::string, model, "",
          "Model directory (config.json, model.safetensors, vocab.json, "
          "merges.txt). Required.");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address; port 0 picks a free port");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address; port 0 picks a free port");
ABSL_FLAG(std::string, device, "auto", "auto | cpu | cuda (auto: CUDA when usable)");
ABSL_FLAG(std::string, dtype, "auto", "auto | f32 | f16 | bf16 (auto: f32 on CPU, bf16 on CUDA)");
ABSL_FLAG(int64_t, kv_cache_bytes, 0,
          "KV pool budget in bytes; 0 = 256 MiB on the CPU, 80% of free memory on CUDA");
ABSL_FLAG(int32_t, block_size, 16, "Tokens per KV block (a power of two)");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "Tokens per engine step (prefill chunks + decodes)");
ABSL_FLAG(int32_t, max_queue, 1024, "Waiting requests before RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_samples, 16, "Largest num_samples a request may ask for");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 = all cores");
ABSL_FLAG(bool, no_prefix_cache, false, "Disable prefix sharing (every prompt is computed)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long running and queued requests may continue");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls-key serves TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(absl::Duration, testing_step_delay, absl::ZeroDuration(),
          "For tests only: pause this long before each engine step");
ABSL_FLAG(std::string, auth_tokens, "",
          "File of \"token tenant\" lines; every Inference call then needs a bearer token");

namespace prefixd {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "prefixd: %s\n", line.c_str());
  std::fflush(stderr);
}

int Fail(const std::string& line) {
  Log(absl::StrCat("error: ", line));
  return 1;
}

// CivetWeb (under prometheus-cpp's Exposer) cannot bind port 0, so for "host:0" ask the OS
// for a free port first. The port could be taken in between; start-up then fails clearly.
std::string ResolveMetricsAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.substr(colon + 1) != "0") return address;
  const std::string host = address.substr(0, colon);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return address;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return address;
  std::string resolved = address;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    resolved = absl::StrCat(host, ":", ntohs(addr.sin_port));
  }
  close(fd);
  return resolved;
}

// CivetWeb (the HTTP server under the Exposer) reports why it failed only through this hook.
int LogCivetMessage(const mg_connection*, const char* message) {
  Log(absl::StrCat("metrics http: ", message));
  return 1;
}

const char* SignalName(int sig) { return sig == SIGTERM ? "SIGTERM" : "SIGINT"; }

// Receives SIGTERM and SIGINT on a thread of its own (main blocks them in every thread before
// any starts). During start-up a signal ends the process at once: nothing has been accepted
// yet, and a model load or CUDA probe should not make Ctrl-C wait. While serving, the first
// signal starts the drain; a second one during the drain ends the grace period now.
class SignalWatcher {
 public:
  SignalWatcher() {
    std::thread([this] { Loop(); }).detach();  // lives until the process exits
  }

  // Serving begins: from now on a signal drains instead of exiting. `engine` is the one a
  // second signal shuts down at once, until EngineStopping().
  void StartServing(Engine* engine) {
    absl::MutexLock lock(&mu_);
    engine_ = engine;
    phase_ = Phase::kServing;
  }

  // Blocks until the first signal after StartServing and returns it.
  int WaitForFirst() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Phase* p) { return *p != Phase::kServing; }, &phase_));
    return first_signal_;
  }

  // The drain has ended: from now on a signal has nothing left to cut short. Waits for a
  // second-signal shutdown in progress, so the engine outlives every use here.
  void EngineStopping() {
    absl::MutexLock lock(&mu_);
    phase_ = Phase::kStopped;
    engine_ = nullptr;
  }

 private:
  enum class Phase { kStarting, kServing, kDraining, kStopped };

  void Loop() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      absl::MutexLock lock(&mu_);
      switch (phase_) {
        case Phase::kStarting:
          Log(absl::StrCat(SignalName(sig), " during start-up: exiting"));
          std::fflush(nullptr);
          std::_Exit(128 + sig);
        case Phase::kServing:
          first_signal_ = sig;
          phase_ = Phase::kDraining;
          break;
        case Phase::kDraining:
          if (engine_ != nullptr) {
            Log(absl::StrCat(SignalName(sig), " again: ending the grace period now"));
            engine_->Shutdown(absl::ZeroDuration());  // returns once the engine thread ends
            engine_ = nullptr;
          }
          break;
        case Phase::kStopped:
          break;
      }
    }
  }

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kStarting;
  int first_signal_ ABSL_GUARDED_BY(mu_) = 0;
  Engine* engine_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// The numeric flags, checked before anything slow (the CUDA probe, the model load), each
// error naming its flag and the value given.
absl::Status CheckFlags() {
  if (const int64_t v = absl::GetFlag(FLAGS_kv_cache_bytes); v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-bytes must be 0 (the default budget) or positive, got ", v));
  }
  if (const int32_t v = absl::GetFlag(FLAGS_block_size); v < 1 || v > 1024 || (v & (v - 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be a power of two from 1 to 1024, got ", v));
  }
  using Named = std::pair<const char*, int32_t>;
  for (const auto& [name, value] :
       {Named{"--max-batch-tokens", absl::GetFlag(FLAGS_max_batch_tokens)},
        Named{"--max-queue", absl::GetFlag(FLAGS_max_queue)},
        Named{"--max-samples", absl::GetFlag(FLAGS_max_samples)}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be at least 1, got ", value));
    }
  }
  if (const int32_t v = absl::GetFlag(FLAGS_threads); v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be 0 (all cores) or positive, got ", v));
  }
  if (const absl::Duration v = absl::GetFlag(FLAGS_testing_step_delay);
      v < absl::ZeroDuration() || v > absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--testing-step-delay must be from 0 to 1s, got ", absl::FormatDuration(v)));
  }
  if (const absl::Duration v = absl::GetFlag(FLAGS_shutdown_grace); v < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shutdown-grace must not be negative, got ", absl::FormatDuration(v)));
  }
  return absl::OkStatus();
}

int Run(SignalWatcher& signals) {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) return Fail("--model DIR is required");
  if (absl::Status s = CheckFlags(); !s.ok()) return Fail(std::string(s.message()));
  if (absl::GetFlag(FLAGS_tls_cert).empty() != absl::GetFlag(FLAGS_tls_key).empty()) {
    return Fail("--tls-cert and --tls-key go together");
  }

  // Probing CUDA initialises its runtime (seconds without a GPU): only when it may be used.
  const std::string device = absl::GetFlag(FLAGS_device);
  const absl::Status cuda_usable =
      device == "auto" || device == "cuda" ? CudaUsable() : absl::UnavailableError("not probed");
  absl::StatusOr<DevicePlan> plan = PlanDevice(device, absl::GetFlag(FLAGS_dtype), cuda_usable);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));
  if (!plan->note.empty()) Log(plan->note);

  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(model_dir);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const ModelConfig config = (*model)->config();
  Log(absl::StrFormat("model %s: %d layers, %d heads, n_embd %d, vocab %d, context %d",
                      (*model)->name(), config.n_layer, config.n_head, config.n_embd,
                      config.vocab_size, config.n_positions));
  Log(absl::StrCat("manifest sha256 ", (*model)->manifest_sha256()));

  BackendOptions bopt;
  bopt.model = model->get();
  bopt.plan = *plan;
  bopt.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  bopt.block_size = absl::GetFlag(FLAGS_block_size);
  bopt.threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(bopt);
  if (!backend.ok()) return Fail(absl::StrCat("backend: ", backend.status().message()));
  Backend& be = **backend;
  Log(absl::StrCat("device ", be.device_name(), ", dtype ", std::string(DTypeName(be.dtype()))));
  Log(absl::StrFormat("KV pool: %d blocks x %d tokens, %d bytes per token, %d bytes",
                      be.num_blocks(), be.block_size(), be.kv_bytes_per_token(),
                      be.memory_usage().kv_pool_bytes));

  EngineOptions eopt;
  eopt.backend = &be;
  eopt.model_config = config;
  eopt.manifest_sha256 = (*model)->manifest_sha256();
  eopt.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  eopt.max_queue = absl::GetFlag(FLAGS_max_queue);
  eopt.max_samples = absl::GetFlag(FLAGS_max_samples);
  eopt.enable_prefix_cache = !absl::GetFlag(FLAGS_no_prefix_cache);
  eopt.testing_step_delay = absl::GetFlag(FLAGS_testing_step_delay);
  if (eopt.testing_step_delay > absl::ZeroDuration()) {
    Log(absl::StrCat("--testing-step-delay ", absl::FormatDuration(eopt.testing_step_delay),
                     ": every engine step waits that long first (for tests, not for serving)"));
  }
  // A sticky device error: the engine has failed every request; drain like on SIGTERM (health
  // goes NOT_SERVING) and exit non-zero so that an orchestrator restarts the process.
  static std::atomic<bool> device_failed{false};
  eopt.on_fatal_error = [](const absl::Status& status) {
    Log(absl::StrCat("fatal backend error, shutting down: ", status.message()));
    device_failed.store(true);
    kill(getpid(), SIGTERM);
  };
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(eopt);
  if (!engine.ok()) return Fail(absl::StrCat("engine: ", engine.status().message()));
  if (!eopt.enable_prefix_cache) Log("prefix cache disabled (--no-prefix-cache)");

  Authenticator auth = Authenticator::AllowAll();
  if (const std::string path = absl::GetFlag(FLAGS_auth_tokens); !path.empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(path);
    if (!a.ok()) return Fail(std::string(a.status().message()));
    auth = *std::move(a);
    Log(absl::StrCat("bearer tokens required (", auth.num_tokens(), " tokens)"));
  }

  // The Exposer is never destroyed: stopping CivetWeb waits out its poll timeouts (~2 s),
  // and the process exits right after serving anyway.
  prometheus::Exposer* exposer = nullptr;
  const std::string metrics_listen = ResolveMetricsAddress(absl::GetFlag(FLAGS_metrics_listen));
  try {
    static CivetCallbacks callbacks;
    callbacks.log_message = &LogCivetMessage;
    exposer = new prometheus::Exposer(metrics_listen, 2, &callbacks);
  } catch (const std::exception& e) {
    return Fail(absl::StrCat("cannot serve metrics on ", metrics_listen, ": ", e.what()));
  }
  Engine* eng = engine->get();
  auto metrics = std::make_shared<ServerMetrics>(
      MetricsSources{[eng] { return eng->Stats(); }, [eng] { return eng->DrainLatencies(); },
                     [&be] { return be.memory_usage(); }});
  exposer->RegisterCollectable(metrics);
  if (std::vector<int> ports = exposer->GetListeningPorts(); !ports.empty()) {
    Log(absl::StrCat("metrics on http://", metrics_listen.substr(0, metrics_listen.rfind(':')), ":",
                     ports[0], "/metrics"));
  }

  InferenceServiceOptions sopt;
  sopt.engine = eng;
  sopt.tokenizer = &(*model)->tokenizer();
  sopt.auth = &auth;
  sopt.metrics = metrics.get();
  sopt.limits.vocab_size = static_cast<uint32_t>(config.vocab_size);
  sopt.limits.context_length = static_cast<uint32_t>(config.n_positions);
  sopt.limits.max_samples = static_cast<uint32_t>(absl::GetFlag(FLAGS_max_samples));
  sopt.limits.block_size = static_cast<uint32_t>(be.block_size());
  sopt.limits.pool_blocks = static_cast<uint64_t>(be.num_blocks());
  v1::ModelInfo& info = sopt.model_info;
  info.set_model_name((*model)->name());
  info.set_manifest_sha256((*model)->manifest_sha256());
  info.set_n_layer(config.n_layer);
  info.set_n_head(config.n_head);
  info.set_n_embd(config.n_embd);
  info.set_vocab_size(config.vocab_size);
  info.set_context_length(config.n_positions);
  info.set_dtype(std::string(DTypeName(be.dtype())));
  info.set_device(be.device_name());
  info.set_block_size(be.block_size());
  info.set_kv_pool_blocks(be.num_blocks());
  info.set_kv_bytes_per_token(be.kv_bytes_per_token());
  InferenceService service(std::move(sopt));

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  const bool tls = !absl::GetFlag(FLAGS_tls_cert).empty();
  if (tls) {
    absl::StatusOr<std::string> cert = ReadWholeFile(absl::GetFlag(FLAGS_tls_cert));
    absl::StatusOr<std::string> key = ReadWholeFile(absl::GetFlag(FLAGS_tls_key));
    if (!cert.ok()) return Fail(std::string(cert.status().message()));
    if (!key.ok()) return Fail(std::string(key.status().message()));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default on Linux: a second prefixd on a busy port would then
  // start and take half of the first one's new connections. Refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(listen, creds, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return Fail(absl::StrCat("cannot listen on ", listen));
  signals.StartServing(eng);  // calls can arrive now: a signal must drain them
  server->GetHealthCheckService()->SetServingStatus(true);
  // A unix socket address has no port to report (gRPC sets `port` to 1 for it).
  const bool unix_socket =
      absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:");
  Log(absl::StrCat("listening on ",
                   unix_socket ? listen
                               : absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port),
                   tls ? " (TLS)" : ""));

  const int sig = signals.WaitForFirst();
  const absl::Duration grace = absl::GetFlag(FLAGS_shutdown_grace);
  server->GetHealthCheckService()->SetServingStatus(false);
  service.StartDraining();
  // Logged once health and new calls already see the drain, so that whoever reads this line
  // (an operator, a test) finds the server in the state it says.
  Log(absl::StrCat(SignalName(sig), ": draining for up to ", absl::FormatDuration(grace),
                   " (a second signal ends it now)"));
  eng->Shutdown(grace);  // every stream has its kDone once this returns
  signals.EngineStopping();
  Log("engine stopped");
  // Reactors now only flush their last messages; a client that stopped reading is cut off.
  // Waiting for them here rather than in Shutdown: gRPC 1.51's Shutdown can sit out its whole
  // deadline after the last call ended (seen with clients that keep their connection).
  if (!service.WaitForNoGenerates(absl::Seconds(5))) Log("cutting off calls still writing");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  // Waits for a scrape in progress, so none reads the engine while it is destroyed.
  exposer->RemoveCollectable(metrics);
  if (device_failed.load()) {
    Log("stopped after a fatal backend error: exit 1");
    return 1;
  }
  Log("stopped");
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  // Block the shutdown signals before any thread starts, so all threads inherit the mask and
  // only the SignalWatcher's sigwait receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  static prefixd::SignalWatcher* signals = new prefixd::SignalWatcher();  // never destroyed

  absl::SetProgramUsageMessage(
      "prefixd --model DIR [--listen 127.0.0.1:50051] [--metrics-listen 127.0.0.1:9464] "
      "[--device auto|cpu|cuda] [--dtype auto|f32|f16|bf16] ... (see docs/SERVER.md)");
  std::vector<std::string> args = prefixd::NormalizeFlagNames({argv, argv + argc});
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "prefixd: error: unexpected argument %s (flags start with --)\n",
                 positional[1]);
    return 1;
  }
  const int code = prefixd::Run(*signals);
  // Everything prefixd started has stopped. Skip the libraries' exit-time destructors: those
  // of the linked CUDA libraries alone take over a second and free nothing the exit does not.
  std::fflush(nullptr);
  std::_Exit(code);
}
