// `prefixctl bench`: a shared-prefix workload. Every request's prompt is the same
// --prefix-tokens ids followed by its own --suffix-tokens ids, so after the first request
// the prefix should come from the cache. Requests run --concurrency at a time; a progress
// bar goes to stderr, then a table (or --json) with throughput, latency percentiles and the
// cache hit ratio.
#ifndef PREFIXD_CLIENT_BENCH_H_
#define PREFIXD_CLIENT_BENCH_H_

#include <ostream>
#include <vector>

#include "client/cli_args.h"
#include "client/connection.h"

namespace prefixd {

// Nearest-rank percentile (p in [0, 100]) of `values`; 0 when empty. Sorts a copy.
double Percentile(std::vector<double> values, double p);

struct BenchReport {
  uint32_t requests_ok = 0;
  uint32_t requests_failed = 0;
  double wall_s = 0;
  uint64_t completion_tokens = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
  std::vector<double> ttft_s;  // one per successful request
  std::vector<double> itl_s;   // one per token after the first
};

void PrintBenchReport(const BenchReport& r, bool json, std::ostream& out);

int RunBench(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_BENCH_H_
