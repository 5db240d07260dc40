// prefixd: flags and signals around prefixd::Server (server/server.h), which does the rest.
// SIGTERM/SIGINT drain, SIGHUP reloads tokens and TLS files, SIGUSR1/SIGUSR2 are ignored
// (docs/SERVER.md); the exit code says how serving ended.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/remote/remote_tier_options.h"
#include "server/flag_names.h"
#include "server/server.h"

ABSL_FLAG(std::string, model, "",
          "Model directory (config.json, model.safetensors, vocab.json, "
          "merges.txt). Required.");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address; port 0 picks a free port; unix:PATH for a unix socket");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address; port 0 picks a free port; off disables it");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8000",
          "OpenAI-compatible HTTP API address; port 0 picks a free port; off disables it");
ABSL_FLAG(std::string, device, "auto", "auto | cpu | cuda (auto: CUDA when usable)");
ABSL_FLAG(std::string, dtype, "auto",
          "auto | f32 | f16 | bf16 | int8 (auto: f32 on CPU, bf16 on CUDA; int8: CPU only)");
ABSL_FLAG(int64_t, kv_cache_bytes, 0,
          "KV pool budget in bytes; 0 = on the CPU 16 sequences at full context (at most 1/4 "
          "of memory), on CUDA 80% of free memory");
ABSL_FLAG(int32_t, block_size, 16, "Tokens per KV block (a power of two)");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "Tokens per engine step (prefill chunks + decodes)");
ABSL_FLAG(int32_t, max_queue, 1024, "Waiting requests before RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_samples, 16, "Largest num_samples a request may ask for");
ABSL_FLAG(double, tenant_cache_share, 1.0,
          "Fraction of the KV pool a tenant's cached blocks may take before its own are "
          "evicted first (0 < F <= 1; 1 = off); share= in --auth-tokens overrides it");
ABSL_FLAG(int32_t, tenant_max_waiting, 0,
          "Requests a tenant may have waiting before more get RESOURCE_EXHAUSTED (0 = no cap); "
          "max_waiting= in --auth-tokens overrides it");
ABSL_FLAG(absl::Duration, max_cache_retention, absl::Hours(24),
          "Longest prompt_cache_retention honoured (\"24h\" asks for 24 hours; 0 = off)");
ABSL_FLAG(int32_t, metrics_tenants, 16,
          "Per-tenant metrics name the first N tenants of --auth-tokens; the rest are \"other\"");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 = all cores");
ABSL_FLAG(bool, no_prefix_cache, false, "Disable prefix sharing (every prompt is computed)");
ABSL_FLAG(std::string, cache_dir, "",
          "Directory of the disk cache tier: evicted prefix blocks are kept there, across "
          "restarts; empty = no disk tier");
ABSL_FLAG(int64_t, cache_dir_bytes, 0,
          "Cap on the disk tier's files; 0 = the smaller of 8 GiB and half the free space");
ABSL_FLAG(std::string, kv_remote, "",
          "Shared cache tier on Redis/Valkey: redis://HOST:PORT[/DB] or unix:///path; every "
          "computed block is published there and admissions match into it; empty = none");
ABSL_FLAG(std::string, kv_remote_password_file, "",
          "File whose first line is the Redis password (AUTH); never put it in --kv-remote");
ABSL_FLAG(std::string, kv_remote_prefix, "prefixd:", "Prefix of every key in the remote tier");
ABSL_FLAG(absl::Duration, kv_remote_timeout, prefixd::kDefaultRemoteTierTimeout,
          "Bound on each remote-tier connect and command; a tier past it is skipped with backoff");
ABSL_FLAG(std::string, kv_events, "",
          "Publish KV events (vLLM's ZMQ stream, for cache-aware routers) on this ZMQ "
          "endpoint: tcp://127.0.0.1:5557, tcp://*:5557 (all interfaces); empty = off");
ABSL_FLAG(std::string, kv_events_replay, "",
          "ZMQ ROUTER endpoint answering replay requests for buffered KV event batches; "
          "empty = no replay");
ABSL_FLAG(std::string, kv_events_topic, "", "Topic frame of every KV event message");
ABSL_FLAG(int64_t, kv_events_buffer, 10000, "KV event batches kept for replay");
ABSL_FLAG(std::string, kv_events_encoding, "map",
          "How each KV event is written: map (vLLM's current wire: tagged maps) or array (its "
          "earlier array-like wire, for routers that read only that)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long running and queued requests may continue");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls-key serves TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(std::string, auth_tokens, "",
          "File of \"token tenant [admin]\" lines; every Inference call then needs a bearer "
          "token (SIGHUP re-reads it)");
ABSL_FLAG(std::string, reflection, "on", "gRPC server reflection: on | off");
ABSL_FLAG(int32_t, max_connections, 0,
          "Open gRPC connections at once, and HTTP API connections likewise (more wait to be "
          "accepted); 0 = derived from the descriptor limit (RLIMIT_NOFILE, raised to its hard "
          "limit at start-up)");
ABSL_FLAG(std::vector<std::string>, adapter, {},
          "A LoRA adapter to serve, as NAME=DIR (a PEFT directory: adapter_config.json and "
          "adapter_model.safetensors); repeatable. Requests name it in GenerateRequest.adapter "
          "or HTTP `model`");
ABSL_FLAG(int32_t, max_adapters, 8, "Most LoRA adapters loaded at once");
ABSL_FLAG(absl::Duration, connection_idle_timeout, absl::Seconds(300),
          "Close a gRPC connection that has had no call, or an HTTP connection no request, for "
          "this long");
ABSL_FLAG(absl::Duration, request_header_timeout, absl::Seconds(2),
          "HTTP and metrics listeners: answer 408 and close a connection whose request header "
          "is not complete this long after its first byte (slowloris)");
ABSL_FLAG(absl::Duration, request_body_timeout, absl::Seconds(60),
          "HTTP and metrics listeners: answer 408 and close a connection whose request body "
          "is not complete this long after its header");
ABSL_FLAG(absl::Duration, response_write_timeout, absl::Seconds(60),
          "Cut off a client that takes none of an answer's bytes for this long: cancel its "
          "completion and close its HTTP connection, or cancel its gRPC Generate call");

namespace prefixd {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "prefixd: %s\n", line.c_str());
  std::fflush(stderr);
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "SIGUSR2";
  }
}

// The signals the watcher receives; main blocks them in every thread before any starts.
sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

// Receives SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 on a thread of its own. During
// start-up SIGTERM/SIGINT end the process at once: nothing has been accepted yet, and a
// model load or CUDA probe should not make Ctrl-C wait. While serving, the first of them
// starts the drain; a second one during the drain ends the grace period now. SIGHUP reloads
// the tokens file and the TLS certificate and key (Server::Reload); one that arrives during
// start-up is applied as serving starts (the files may have changed after start-up read
// them), and one during the drain or after is ignored. SIGUSR1 and
// SIGUSR2 are logged and ignored, so that a stray one does not kill the server.
class SignalWatcher {
 public:
  explicit SignalWatcher(absl::Duration grace) : grace_(grace) {
    std::thread([this] { Loop(); }).detach();  // lives until the process exits
  }

  // Serving begins: from now on a signal drains `server` instead of exiting.
  void StartServing(Server* server) {
    absl::MutexLock lock(&mu_);
    server_ = server;
    if (reload_pending_) {
      reload_pending_ = false;
      Log("SIGHUP during start-up: reloading");
      server_->Reload().IgnoreError();  // it logs what it kept and why
    }
  }

  // The server has stopped: from now on a signal has nothing left to cut short. Waits for a
  // signal being handled, so the server outlives every use here.
  void Stopped() {
    absl::MutexLock lock(&mu_);
    server_ = nullptr;
    stopped_ = true;
  }

 private:
  void Loop() {
    const sigset_t set = WatchedSignals();
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      absl::MutexLock lock(&mu_);
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        Log(absl::StrCat(SignalName(sig), " ignored"));
        continue;
      }
      if (sig == SIGHUP) {
        if (server_ == nullptr && !stopped_) {
          reload_pending_ = true;  // StartServing reloads
        } else if (server_ == nullptr || draining_) {
          Log("SIGHUP ignored: not serving");
        } else {
          Log("SIGHUP: reloading");
          server_->Reload().IgnoreError();  // it logs what it kept and why
        }
        continue;
      }
      if (stopped_) continue;
      if (server_ == nullptr) {
        Log(absl::StrCat(SignalName(sig), " during start-up: exiting"));
        std::fflush(nullptr);
        std::_Exit(128 + sig);
      }
      if (!draining_) {
        draining_ = true;
        server_->BeginDrain(grace_);
        // Logged once health and new calls already see the drain, so that whoever reads
        // this line finds the server in the state it says.
        Log(absl::StrCat(SignalName(sig), ": draining for up to ", absl::FormatDuration(grace_),
                         " (a second signal ends it now)"));
      } else {
        Log(absl::StrCat(SignalName(sig), " again: ending the grace period now"));
        server_->BeginDrain(absl::ZeroDuration());
      }
    }
  }

  const absl::Duration grace_;
  absl::Mutex mu_;
  Server* server_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool reload_pending_ ABSL_GUARDED_BY(mu_) = false;
};

// Every --adapter value as given (absl's own flag keeps only the last one), set by main.
std::vector<std::string>& AdapterFlagValues() {
  static std::vector<std::string>* values = new std::vector<std::string>();
  return *values;
}

ServerOptions OptionsFromFlags() {
  ServerOptions o;
  o.adapters.adapters = AdapterFlagValues();
  o.adapters.max_adapters = absl::GetFlag(FLAGS_max_adapters);
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.device.device = absl::GetFlag(FLAGS_device);
  o.device.dtype = absl::GetFlag(FLAGS_dtype);
  o.device.kv_pool.budget_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  o.device.kv_pool.block_size = absl::GetFlag(FLAGS_block_size);
  o.device.threads = absl::GetFlag(FLAGS_threads);
  o.engine.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.engine.max_queue = absl::GetFlag(FLAGS_max_queue);
  o.engine.tenant_cache_share = absl::GetFlag(FLAGS_tenant_cache_share);
  o.engine.tenant_max_waiting = absl::GetFlag(FLAGS_tenant_max_waiting);
  o.engine.max_cache_retention = absl::GetFlag(FLAGS_max_cache_retention);
  o.metrics_tenants = absl::GetFlag(FLAGS_metrics_tenants);
  o.engine.max_samples = absl::GetFlag(FLAGS_max_samples);
  o.engine.enable_prefix_cache = !absl::GetFlag(FLAGS_no_prefix_cache);
  o.engine.disk_tier.dir = absl::GetFlag(FLAGS_cache_dir);
  o.engine.disk_tier.max_bytes = absl::GetFlag(FLAGS_cache_dir_bytes);
  o.engine.remote_tier.url = absl::GetFlag(FLAGS_kv_remote);
  o.engine.remote_tier.key_prefix = absl::GetFlag(FLAGS_kv_remote_prefix);
  o.engine.remote_tier.timeout = absl::GetFlag(FLAGS_kv_remote_timeout);
  o.kv_remote_password_file = absl::GetFlag(FLAGS_kv_remote_password_file);
  o.kv_events.endpoint = absl::GetFlag(FLAGS_kv_events);
  o.kv_events.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay);
  o.kv_events.topic = absl::GetFlag(FLAGS_kv_events_topic);
  o.kv_events.buffer_batches = absl::GetFlag(FLAGS_kv_events_buffer);
  o.kv_events.encoding = absl::GetFlag(FLAGS_kv_events_encoding);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.http_listen = absl::GetFlag(FLAGS_http_listen);
  o.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  o.reflection = absl::GetFlag(FLAGS_reflection) != "off";
  o.max_connections = absl::GetFlag(FLAGS_max_connections);
  o.connection_idle_timeout = absl::GetFlag(FLAGS_connection_idle_timeout);
  o.request_header_timeout = absl::GetFlag(FLAGS_request_header_timeout);
  o.request_body_timeout = absl::GetFlag(FLAGS_request_body_timeout);
  o.response_write_timeout = absl::GetFlag(FLAGS_response_write_timeout);
  return o;
}

int Run() {
  ServerOptions options = OptionsFromFlags();
  if (const std::string r = absl::GetFlag(FLAGS_reflection); r != "on" && r != "off") {
    Log(absl::StrCat("error: --reflection must be on or off, got ", r));
    return 1;
  }
  // Connections take descriptors: use all the hard limit allows.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) Log("could not raise the descriptor limit");
  }
  // Never destroyed: it may be in sigwait when the process exits. Its grace is used only once
  // serving has started, so after Server::Start checked it with the other options.
  static SignalWatcher* signals = new SignalWatcher(options.shutdown_grace);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(options));
  if (!server.ok()) {
    Log(absl::StrCat("error: ", server.status().message()));
    return 1;
  }
  signals->StartServing(server->get());
  const absl::Status ended = (*server)->Wait();
  signals->Stopped();
  if (!ended.ok()) {
    Log("stopped after a fatal backend error: exit 1");
    return 1;
  }
  Log("stopped");
  // The Server is not destroyed: the process exits next, which frees everything at once.
  server->release();
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  // Block the watched signals before any thread starts, so all threads inherit the mask and
  // only the SignalWatcher's sigwait receives them.
  const sigset_t set = prefixd::WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // --help lists the flags of this file (absl's default matches only files named like the
  // program); --helpfull adds the libraries'.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "prefixd --model DIR [--listen 127.0.0.1:50051] [--metrics-listen 127.0.0.1:9464] "
      "[--device auto|cpu|cuda] [--dtype auto|f32|f16|bf16|int8] ... (see docs/SERVER.md)");
  std::vector<std::string> args = prefixd::NormalizeFlagNames({argv, argv + argc});
  prefixd::AdapterFlagValues() = prefixd::RepeatedFlagValues(args, "adapter");
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "prefixd: error: unexpected argument %s (flags start with --)\n",
                 positional[1]);
    return 1;
  }
  const int code = prefixd::Run();
  // Everything prefixd started has stopped. Skip the libraries' exit-time destructors: those
  // of the linked CUDA libraries alone take over a second and free nothing the exit does not.
  std::fflush(nullptr);
  std::_Exit(code);
}
