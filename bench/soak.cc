// Soak through a running prefixd: many Generate calls of every kind, then checks that the
// server ended each one and gave everything back.
//
//   soak --target 127.0.0.1:50051 --metrics_port 9464 --server_pid PID
//        [--requests 10000] [--concurrency 16] [--auth_tokens FILE] [--seed 1]
//
// Calls (each one's shape drawn from --seed and its index): prompts that share one of a few
// prefixes per tenant, as token ids or as text; 1 to 4 samples (forks), now and then 8; and
// fates drawn at random — run to the end, cancelled by the client after a random number of
// messages, cut by a deadline of 30 to 400 ms, refused as invalid (INVALID_ARGUMENT), or sent
// with an unknown token (UNAUTHENTICATED, when --auth_tokens names the server's token file;
// its tokens, first column, spread the calls over tenants). Cancels and deadlines act only
// once the first message arrived, so the server has seen every call.
//
// A scraper reads /metrics once a second throughout, as Prometheus would.
//
// Checks, each printed with its figures; exit 0 only when all hold:
//   0. /metrics answered every scrape;
//   1. every call ended exactly once with a status from its fate's set, and a call that
//      ended OK carried every sample to its length with one finish each and one usage;
//   2. prefixd_kv_blocks{state="active"} drops to 0 and free + cached = the pool;
//   3. prefixd_requests_total, summed over codes, rose by exactly --requests, and its OK,
//      INVALID_ARGUMENT and UNAUTHENTICATED counts agree with what the client saw;
//   4. the server's VmRSS after the run is within --max_rss_growth (5%) of its VmRSS after
//      the first tenth of the calls (with --server_pid).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "prefixd's gRPC address");
ABSL_FLAG(int, metrics_port, 9464, "prefixd's metrics port on 127.0.0.1");
ABSL_FLAG(int, server_pid, 0, "prefixd's process id, for its VmRSS");
ABSL_FLAG(int, requests, 10000, "Generate calls to make");
ABSL_FLAG(int, concurrency, 16, "calls in flight at once");
ABSL_FLAG(std::string, auth_tokens, "", "the server's --auth-tokens file (empty: no tokens)");
ABSL_FLAG(uint32_t, seed, 1, "seed of every call's shape");
ABSL_FLAG(double, max_rss_growth, 0.05,
          "largest change of the server's VmRSS from the first tenth of the calls to the end, "
          "as a fraction");

namespace prefixd::soak {
namespace {

enum class Fate { kComplete, kCancel, kDeadline, kInvalid, kBadToken };
constexpr const char* kFateNames[] = {"complete", "cancel", "deadline", "invalid", "bad_token"};

struct Call {
  v1::GenerateRequest request;
  std::string token;  // empty: none
  Fate fate = Fate::kComplete;
  int cancel_after_messages = 0;  // kCancel
  int deadline_ms = 0;            // kDeadline
};

// Words for text prompts; every one is a few GPT-2 tokens.
constexpr const char* kWords[] = {"the",   "cache", "prefix", "block", "server", "token",
                                  "river", "blue",  "seven",  "quiet", "engine", "forest"};

Call MakeCall(uint32_t seed, int index, const std::vector<std::string>& tokens) {
  std::mt19937 rng(seed * 1000003u + static_cast<uint32_t>(index));
  const auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  Call c;
  const int tenant = tokens.empty() ? 0 : uniform(0, static_cast<int>(tokens.size()) - 1);
  if (!tokens.empty()) c.token = tokens[tenant];
  // Four shared prefixes per tenant: their blocks are cached and reused across calls.
  const int prefix = uniform(0, 3);
  v1::GenerateRequest& r = c.request;
  if (uniform(0, 3) == 0) {
    std::string text = absl::StrCat("Tenant ", tenant, " prefix ", prefix, ":");
    for (int i = 0; i < 24; ++i) absl::StrAppend(&text, " ", kWords[(prefix * 7 + i) % 12]);
    for (int i = uniform(0, 12); i > 0; --i) absl::StrAppend(&text, " ", kWords[uniform(0, 11)]);
    r.set_text(text);
  } else {
    std::mt19937 prefix_rng(static_cast<uint32_t>(tenant * 16 + prefix + 1));
    for (int i = 0; i < 40; ++i) r.mutable_token_ids()->add_ids(prefix_rng() % 50000);
    for (int i = uniform(0, 24); i > 0; --i) r.mutable_token_ids()->add_ids(rng() % 50000);
  }
  r.set_max_new_tokens(static_cast<uint32_t>(uniform(1, 24)));
  r.set_num_samples(static_cast<uint32_t>(uniform(0, 19) == 0 ? 8 : uniform(1, 4)));
  r.set_temperature(uniform(0, 1) == 0 ? 0.0f : 0.9f);
  r.set_seed(rng());
  r.set_ignore_eos(true);  // every sample runs to max_new_tokens: its length is known
  if (uniform(0, 1) == 0) r.set_request_id(absl::StrCat("soak-", index));

  const int fate = uniform(0, 99);
  if (fate < 60) {
    c.fate = Fate::kComplete;
  } else if (fate < 72) {
    c.fate = Fate::kCancel;
    c.cancel_after_messages = uniform(1, 6);
    r.set_max_new_tokens(64);
  } else if (fate < 84) {
    c.fate = Fate::kDeadline;
    c.deadline_ms = uniform(30, 400);
    r.set_max_new_tokens(150);
  } else if (fate < 94 || tokens.empty()) {
    c.fate = Fate::kInvalid;
    switch (uniform(0, 3)) {
      case 0:
        r.set_max_new_tokens(0);
        break;
      case 1:  // an id beyond the vocabulary
        r.mutable_token_ids()->add_ids(60000);
        break;
      case 2:
        r.set_top_p(1.5f);
        break;
      default:  // beyond the context
        r.set_max_new_tokens(100000);
        break;
    }
  } else {
    c.fate = Fate::kBadToken;
    c.token = "not-a-token";
  }
  return c;
}

// The codes a call of each fate may end with. A cancel or deadline can lose the race to the
// call's own end, so OK is allowed there.
bool Allowed(Fate fate, grpc::StatusCode code) {
  switch (fate) {
    case Fate::kComplete:
      return code == grpc::OK;
    case Fate::kCancel:
      return code == grpc::CANCELLED || code == grpc::OK;
    case Fate::kDeadline:
      return code == grpc::DEADLINE_EXCEEDED || code == grpc::OK;
    case Fate::kInvalid:
      return code == grpc::INVALID_ARGUMENT;
    case Fate::kBadToken:
      return code == grpc::UNAUTHENTICATED;
  }
  return false;
}

struct Outcome {
  grpc::StatusCode code = grpc::UNKNOWN;
  std::string problem;  // empty when the call ended as its fate allows
};

Outcome RunCall(v1::Inference::Stub& stub, const Call& c) {
  grpc::ClientContext ctx;
  const auto now = std::chrono::system_clock::now();
  ctx.set_deadline(now + (c.fate == Fate::kDeadline ? std::chrono::milliseconds(c.deadline_ms)
                                                    : std::chrono::milliseconds(120000)));
  if (!c.token.empty()) ctx.AddMetadata("authorization", "Bearer " + c.token);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, c.request);
  const uint32_t samples = c.request.num_samples() == 0 ? 1 : c.request.num_samples();
  std::map<uint32_t, int> tokens, finishes;
  int usages = 0, messages = 0;
  uint64_t completion = 0;
  std::string problem;
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    ++messages;
    if (usages > 0) problem = "a message after the usage message";
    if (msg.sample_index() >= samples) problem = "a sample index beyond num_samples";
    if (finishes[msg.sample_index()] > 0 && msg.token_ids_size() > 0) {
      problem = "tokens after a sample's finish";
    }
    tokens[msg.sample_index()] += msg.token_ids_size();
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) ++finishes[msg.sample_index()];
    if (msg.has_usage()) {
      ++usages;
      completion = msg.usage().completion_tokens();
    }
    if (c.fate == Fate::kCancel && messages == c.cancel_after_messages) ctx.TryCancel();
  }
  const grpc::Status status = reader->Finish();
  Outcome out;
  out.code = status.error_code();
  if (!Allowed(c.fate, out.code)) {
    out.problem = absl::StrCat("fate ", kFateNames[static_cast<int>(c.fate)], " ended ",
                               static_cast<int>(out.code), ": ", status.error_message());
  } else if (!problem.empty()) {
    out.problem = problem;
  } else if (out.code == grpc::OK) {
    uint64_t total = 0;
    for (uint32_t s = 0; s < samples; ++s) {
      if (tokens[s] != static_cast<int>(c.request.max_new_tokens()) || finishes[s] != 1) {
        out.problem = absl::StrCat("sample ", s, " got ", tokens[s], " tokens of ",
                                   c.request.max_new_tokens(), " and ", finishes[s], " finishes");
      }
      total += tokens[s];
    }
    if (usages != 1 || completion != total) {
      out.problem = absl::StrCat(usages, " usage messages; completion_tokens ", completion, " for ",
                                 total, " tokens received");
    }
  }
  return out;
}

// GET /metrics from 127.0.0.1:port; empty on failure.
std::string ScrapeMetrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string resp;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        resp.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// Sum of the samples whose series starts with `prefix` ("name{" for every label set, or
// "name{label=\"v\"} " for one); -1 when there is none.
double SumSeries(const std::string& exposition, const std::string& prefix) {
  double sum = -1;
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    const size_t space = line.rfind(' ');
    sum = (sum < 0 ? 0 : sum) + std::stod(line.substr(space + 1));
  }
  return sum;
}

// Every series of `name` whose labels include each of `labels` (k="v"), summed over the
// others (such as `adapter`); -1 when none.
double SumSeriesWith(const std::string& exposition, const std::string& name,
                     std::initializer_list<std::string> labels) {
  double sum = -1;
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + " ", 0) != 0 && line.rfind(name + "{", 0) != 0) continue;
    const std::string series = line.substr(0, line.rfind(' '));
    bool match = true;
    for (const std::string& l : labels) match = match && series.find(l) != std::string::npos;
    if (!match) continue;
    sum = (sum < 0 ? 0 : sum) + std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

double Series(const std::string& exposition, const std::string& name) {
  return SumSeriesWith(exposition, name, {});
}

// VmRSS of `pid` in kB; -1 when unreadable.
long RssKb(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

std::vector<std::string> ReadTokens(const std::string& path) {
  std::vector<std::string> tokens;
  if (path.empty()) return tokens;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (fields.empty() || fields[0][0] == '#') continue;
    tokens.push_back(fields[0]);
  }
  return tokens;
}

int Run() {
  const int requests = absl::GetFlag(FLAGS_requests);
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  const int pid = absl::GetFlag(FLAGS_server_pid);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  const uint32_t seed = absl::GetFlag(FLAGS_seed);
  const std::vector<std::string> tokens = ReadTokens(absl::GetFlag(FLAGS_auth_tokens));
  if (!absl::GetFlag(FLAGS_auth_tokens).empty() && tokens.empty()) {
    std::fprintf(stderr, "soak: no tokens in %s\n", absl::GetFlag(FLAGS_auth_tokens).c_str());
    return 2;
  }
  const std::string before = ScrapeMetrics(metrics_port);
  const double requests_before = SumSeries(before, "prefixd_requests_total{");
  if (before.empty()) {
    std::fprintf(stderr, "soak: no metrics on 127.0.0.1:%d\n", metrics_port);
    return 2;
  }
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    if (!tokens.empty()) ctx.AddMetadata("authorization", "Bearer " + tokens[0]);
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      std::fprintf(stderr, "soak: GetModelInfo: %s\n", s.error_message().c_str());
      return 2;
    }
  }
  const double pool_blocks = static_cast<double>(info.kv_pool_blocks());

  std::atomic<int> next{0}, done{0};
  std::mutex mu;
  std::map<std::pair<int, int>, int> by_fate_and_code;  // guarded by mu
  std::vector<std::string> problems;                    // guarded by mu
  std::vector<int> ended(requests, 0);                  // statuses per call; guarded by mu
  long rss_first_tenth = -1;                            // guarded by mu
  const int tenth = requests / 10;
  // A scraper, as Prometheus would run one: the server buffers latency observations until
  // a scrape takes them (bounded, engine.h), so without one RSS grows by design.
  std::atomic<bool> stop_scraping{false};
  std::atomic<int> scrapes{0}, failed_scrapes{0};
  std::thread scraper([&] {
    while (!stop_scraping.load()) {
      (ScrapeMetrics(metrics_port).empty() ? failed_scrapes : scrapes).fetch_add(1);
      for (int i = 0; i < 10 && !stop_scraping.load(); ++i) absl::SleepFor(absl::Milliseconds(100));
    }
  });
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w) {
    workers.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < requests;) {
        const Call call = MakeCall(seed, i, tokens);
        const Outcome out = RunCall(*stub, call);
        std::lock_guard<std::mutex> l(mu);
        ++ended[i];
        ++by_fate_and_code[{static_cast<int>(call.fate), static_cast<int>(out.code)}];
        if (!out.problem.empty() && problems.size() < 20) {
          problems.push_back(absl::StrCat("call ", i, ": ", out.problem));
        }
        if (done.fetch_add(1) + 1 == tenth && pid > 0) rss_first_tenth = RssKb(pid);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stop_scraping.store(true);
  scraper.join();

  bool ok = true;
  const auto check = [&](bool pass, const std::string& what) {
    std::printf("%s %s\n", pass ? "ok  " : "FAIL", what.c_str());
    ok = ok && pass;
  };
  std::printf("%d calls in %.1f s (%.0f calls/s), concurrency %d, %zu tenants\n", requests, seconds,
              requests / seconds, concurrency, tokens.empty() ? size_t{1} : tokens.size());
  std::map<int, long> client_codes;
  for (const auto& [fate_code, n] : by_fate_and_code) {
    std::printf("  %-9s status %2d: %d\n", kFateNames[fate_code.first], fate_code.second, n);
    client_codes[fate_code.second] += n;
  }
  check(failed_scrapes.load() == 0,
        absl::StrCat("/metrics answered every scrape during the run: ", scrapes.load(), " of ",
                     scrapes.load() + failed_scrapes.load()));
  int once = 0;
  for (int e : ended) once += e == 1 ? 1 : 0;
  check(once == requests && problems.empty(),
        absl::StrCat("every call ended exactly once as its fate allows: ", once, " of ", requests,
                     ", ", problems.size(), " problems"));
  for (const std::string& p : problems) std::printf("       %s\n", p.c_str());

  // Cancelled calls give their blocks back on the engine thread: wait for it briefly.
  std::string after;
  double active = -1;
  for (int i = 0; i < 100; ++i) {
    after = ScrapeMetrics(metrics_port);
    active = Series(after, "prefixd_kv_blocks{state=\"active\"}");
    if (active == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  const double free_blocks = Series(after, "prefixd_kv_blocks{state=\"free\"}");
  const double cached = Series(after, "prefixd_kv_blocks{state=\"cached\"}");
  check(active == 0, absl::StrCat("prefixd_kv_blocks{state=\"active\"} = ", active));
  check(free_blocks >= 0 && cached >= 0 && free_blocks + cached == pool_blocks,
        absl::StrCat("free ", free_blocks, " + cached ", cached, " = ", free_blocks + cached,
                     " blocks; the pool (GetModelInfo kv_pool_blocks) is ", pool_blocks));

  // What the pool went through (counter rises during the run).
  for (const char* name : {"prefixd_prefix_cache_hit_tokens_total", "prefixd_prefill_tokens_total",
                           "prefixd_generated_tokens_total", "prefixd_kv_evictions_total",
                           "prefixd_kv_cow_copies_total", "prefixd_preemptions_total"}) {
    const double b = Series(before, name), a = Series(after, name);
    std::printf("  %-38s +%.0f\n", name, a - (b < 0 ? 0 : b));
  }
  const double requests_after = SumSeries(after, "prefixd_requests_total{");
  const double counted = requests_after - (requests_before < 0 ? 0 : requests_before);
  check(counted == requests,
        absl::StrCat("prefixd_requests_total rose by ", counted, " (", requests, " calls)"));
  const auto server_code = [&](const char* code) {
    const std::string code_label = absl::StrCat("code=\"", code, "\"");
    const double b = SumSeriesWith(before, "prefixd_requests_total", {"api=\"grpc\"", code_label});
    const double a = SumSeriesWith(after, "prefixd_requests_total", {"api=\"grpc\"", code_label});
    return (a < 0 ? 0 : a) - (b < 0 ? 0 : b);
  };
  const double server_ok = server_code("OK");
  const long client_ok = client_codes[grpc::OK];
  const long client_cut = client_codes[grpc::CANCELLED] + client_codes[grpc::DEADLINE_EXCEEDED];
  check(server_ok >= client_ok && server_ok <= client_ok + client_cut &&
            server_code("INVALID_ARGUMENT") == client_codes[grpc::INVALID_ARGUMENT] &&
            server_code("UNAUTHENTICATED") == client_codes[grpc::UNAUTHENTICATED],
        absl::StrCat("server counts agree: OK ", server_ok, " (client ", client_ok, " + at most ",
                     client_cut, " cut short), INVALID_ARGUMENT ", server_code("INVALID_ARGUMENT"),
                     ", UNAUTHENTICATED ", server_code("UNAUTHENTICATED")));

  if (pid > 0) {
    const long rss_end = RssKb(pid);
    const double growth = rss_first_tenth > 0 ? double(rss_end) / rss_first_tenth - 1 : 1;
    const double bound = absl::GetFlag(FLAGS_max_rss_growth);
    check(rss_first_tenth > 0 && rss_end > 0 && growth <= bound && growth >= -bound,
          absl::StrCat("server VmRSS ", rss_first_tenth, " kB after ", tenth, " calls, ", rss_end,
                       " kB after ", requests, " (", absl::StrFormat("%+.1f", 100 * growth),
                       "%, within ", absl::StrFormat("%.0f", 100 * bound), "%)"));
  }
  std::printf("%s\n", ok ? "soak: all checks passed" : "soak: FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace prefixd::soak

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return prefixd::soak::Run();
}
