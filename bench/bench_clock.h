// Clocks the benchmark programs share.
#ifndef PREFIXD_BENCH_BENCH_CLOCK_H_
#define PREFIXD_BENCH_BENCH_CLOCK_H_

#include <time.h>

#include <chrono>

namespace prefixd::bench {

// Wall seconds on a monotonic clock.
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of all the process's threads: on a shared machine, wall time includes waiting
// for a core, CPU time does not (it still includes spinning at barriers).
inline double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_BENCH_CLOCK_H_
