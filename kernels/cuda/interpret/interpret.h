// What tests and the server may ask the CUDA interpreter directly (an interpret build only:
// PREFIXD_CUDA_INTERPRET is defined where this is usable).
#ifndef PREFIXD_KERNELS_CUDA_INTERPRET_INTERPRET_H_
#define PREFIXD_KERNELS_CUDA_INTERPRET_INTERPRET_H_

#include <cstdint>
#include <string>

namespace prefixd::cuda_interpret {

// The declared device's name, e.g. "NVIDIA H200 (interpreted on the CPU)".
std::string DeviceName();

// Makes every device call fail as on a machine whose driver is missing
// (cudaErrorInsufficientDriver), or undoes that: for the tests of the no-device path.
void SimulateMissingDriver(bool missing);

// What the last failed launch, copy or product reported (empty if none failed): the block and
// thread, and what a GPU would have done.
std::string LastFailure();

// Counters over the process's life, for tests that must see work was done where they expect.
struct Counters {
  int64_t kernel_launches = 0;  // launches that ran (replayed graph launches included)
  int64_t graph_launches = 0;
  int64_t gemms = 0;
};
Counters GetCounters();

}  // namespace prefixd::cuda_interpret

#endif  // PREFIXD_KERNELS_CUDA_INTERPRET_INTERPRET_H_
