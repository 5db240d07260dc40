// The CUDA runtime subset of runtime_api.h on the host (see that header for the declared
// device and the rules followed).
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/interpret/interpret.h"
#include "kernels/cuda/interpret/launch.h"
#include "kernels/cuda/interpret/runtime_api.h"
#include "kernels/cuda/interpret/runtime_internal.h"
#include "kernels/cuda/interpret/scheduler.h"

struct CUstream_st {
  unsigned int flags = 0;
  bool capturing = false;
  bool invalidated = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id capture_thread;  // the thread that began the capture
  std::vector<prefixd::cuda_interpret::StreamWork> captured;
};
struct CUgraph_st {
  std::vector<prefixd::cuda_interpret::StreamWork> work;
};
struct CUgraphExec_st {
  std::vector<prefixd::cuda_interpret::StreamWork> work;
};

#if defined(__SANITIZE_ADDRESS__)
// The interpret build runs kernels/cuda under AddressSanitizer for its bounds checks; leak
// reports of the libraries the test binaries and the server link would fail runs that have
// no kernel fault, so leak detection is off unless ASAN_OPTIONS turns it on.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
#endif

namespace prefixd::cuda_interpret {
namespace {

// The declared device (runtime_api.h).
constexpr int kSmCount = 132;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kSharedBytesPerBlock = 48 << 10;
constexpr size_t kAllocationAlign = 256;

size_t DeclaredMemory() {
  static const size_t bytes = [] {
    uint64_t mb = 4096;
    if (const char* v = std::getenv("PREFIXD_CUDA_INTERPRET_MEMORY_MB");
        v != nullptr && !absl::SimpleAtoi(v, &mb)) {
      std::fprintf(stderr,
                   "prefixd: cuda interpreter: PREFIXD_CUDA_INTERPRET_MEMORY_MB=%s is not "
                   "a number of MiB; using 4096\n",
                   v);
      mb = 4096;
    }
    return static_cast<size_t>(mb) << 20;
  }();
  return bytes;
}

struct Allocation {
  size_t bytes = 0;
  bool device = false;
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Allocation> allocations;  // by base address
  size_t device_bytes = 0;
  // Streams capturing in global or thread-local mode (relaxed captures prohibit nothing).
  std::set<CUstream_st*> captures;
  std::string last_failure;
};
State& S() {
  static State* s = new State;  // never destroyed: device calls may come from static teardown
  return *s;
}

std::atomic<int> sticky_error{cudaSuccess};
std::atomic<bool> missing_driver{false};
std::atomic<int64_t> kernel_launches{0}, graph_launches{0}, gemms{0};
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

void RecordFailure(const std::string& message) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().last_failure = message;
}

// Refuses `call` where CUDA prohibits it during a capture, invalidating the captures that
// prohibit it, as CUDA does: an unsafe call (`unsafe`: cudaMalloc, a synchronous copy...) is
// refused while any stream captures in global mode or this thread captures in thread-local
// mode; work on the legacy default stream (`unsafe` false) only during a global capture.
bool RefusedDuringCapture(const char* call, bool unsafe = true) {
  std::lock_guard<std::mutex> lock(S().mu);
  bool refused = false;
  for (CUstream_st* s : S().captures) {
    if (s->mode == cudaStreamCaptureModeGlobal ||
        (unsafe && s->capture_thread == std::this_thread::get_id())) {
      s->invalidated = true;
      refused = true;
    }
  }
  if (!refused) return false;
  S().last_failure = absl::StrFormat(
      "%s while a stream is being captured in global mode, or in thread-local mode by this "
      "thread: refused, and the capture is invalidated",
      call);
  return true;
}

// The checks at the start of every call that reaches the device: the simulated missing
// driver, then a sticky error. Returns cudaSuccess when the call may go on.
cudaError_t Enter() {
  if (DriverMissing()) return cudaErrorInsufficientDriver;
  if (const cudaError_t e = StickyError(); e != cudaSuccess) return SetError(e);
  return cudaSuccess;
}

cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  const bool dst_device = InDeviceAllocation(dst, bytes);
  const bool src_device = InDeviceAllocation(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost:
      ok = !dst_device && !src_device;
      break;
    case cudaMemcpyHostToDevice:
      ok = dst_device && !src_device;
      break;
    case cudaMemcpyDeviceToHost:
      ok = src_device && !dst_device;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dst_device && src_device;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      ok = false;
  }
  if (!ok) {
    RecordFailure(absl::StrFormat(
        "cudaMemcpy of %d bytes (kind %d) from %p to %p: a device side reaches outside every "
        "device allocation, or a host side is device memory",
        bytes, static_cast<int>(kind), src, dst));
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

const char* ErrorName(cudaError_t e, bool text) {
  struct Entry {
    cudaError_t error;
    const char* name;
    const char* text;
  };
  static constexpr Entry kEntries[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
      {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
       "CUDA driver version is insufficient for CUDA runtime version"},
      {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
       "CUDA-capable device(s) is/are busy or unavailable"},
      {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
      {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable",
       "uncorrectable ECC error encountered"},
      {cudaErrorContained, "cudaErrorContained", "container error"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
      {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation is not permitted"},
      {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
       "an illegal memory access was encountered"},
      {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
       "too many resources requested for launch"},
      {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
      {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
      {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
      {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction",
       "an illegal instruction was encountered"},
      {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
      {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace",
       "operation not supported on global/shared address space"},
      {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
      {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
      {cudaErrorTensorMemoryLeak, "cudaErrorTensorMemoryLeak", "tensor memory leak"},
      {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
      {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
      {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
       "operation not permitted when stream is capturing"},
      {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
       "operation failed due to a previous error during capture"},
      {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
       "operation would make the legacy stream depend on a capturing blocking stream"},
      {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
       "attempt to terminate a thread-local capture sequence from another thread"},
      {cudaErrorExternalDevice, "cudaErrorExternalDevice",
       "an error in an external device was encountered"},
      {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
  };
  for (const Entry& entry : kEntries) {
    if (entry.error == e) return text ? entry.text : entry.name;
  }
  return text ? "unrecognized error code" : "cudaErrorUnknown";
}

}  // namespace

// ---- shared with cublas.cc ------------------------------------------------------------------

cudaError_t SetError(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

void FailSticky(cudaError_t error, const std::string& message) {
  int expected = cudaSuccess;
  if (sticky_error.compare_exchange_strong(expected, error)) {
    std::fprintf(stderr, "prefixd: cuda interpreter: %s: %s\n", ErrorName(error, false),
                 message.c_str());
  }
  RecordFailure(message);
  SetError(error);
}

cudaError_t StickyError() {
  return static_cast<cudaError_t>(sticky_error.load(std::memory_order_acquire));
}

bool DriverMissing() {
  if (!missing_driver.load(std::memory_order_relaxed)) return false;
  SetError(cudaErrorInsufficientDriver);
  return true;
}

bool InDeviceAllocation(const void* ptr, size_t bytes) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(S().mu);
  auto it = S().allocations.upper_bound(p);
  if (it == S().allocations.begin()) return false;
  --it;
  return it->second.device && p - it->first <= it->second.bytes &&
         bytes <= it->second.bytes - (p - it->first);
}

cudaError_t Enqueue(cudaStream_t stream, StreamWork work) {
  if (stream != nullptr) {
    std::unique_lock<std::mutex> lock(S().mu);
    if (stream->capturing) {
      if (stream->invalidated) return cudaErrorStreamCaptureInvalidated;
      stream->captured.push_back(std::move(work));
      return cudaSuccess;
    }
  } else if (RefusedDuringCapture("work on the legacy default stream", /*unsafe=*/false)) {
    return cudaErrorStreamCaptureImplicit;
  }
  work();
  return StickyError();
}

void CountGemm() { gemms.fetch_add(1, std::memory_order_relaxed); }

void LaunchKernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                  std::function<void()> body) {
  if (Enter() != cudaSuccess) return;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  cudaError_t refused = cudaSuccess;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      threads > kMaxThreadsPerBlock || block.z > 64 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    refused = cudaErrorInvalidConfiguration;
  } else if (shared_bytes > kSharedBytesPerBlock) {
    refused = cudaErrorInvalidValue;
  }
  if (refused != cudaSuccess) {
    RecordFailure(absl::StrFormat(
        "launch of grid (%u, %u, %u) x block (%u, %u, %u) with %d bytes of dynamic shared "
        "memory refused: a block holds at most %d threads (z at most 64) and %d bytes of "
        "shared memory, a grid at most (2^31 - 1, 65535, 65535) blocks, none of them 0",
        grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, kMaxThreadsPerBlock,
        kSharedBytesPerBlock));
    SetError(refused);
    return;
  }
  const cudaError_t e = Enqueue(stream, [grid, block, body = std::move(body)] {
    if (StickyError() != cudaSuccess) return;  // a broken context runs nothing more
    kernel_launches.fetch_add(1, std::memory_order_relaxed);
    const std::string failure = RunGrid(grid, block, body);
    if (!failure.empty()) {
      FailSticky(cudaErrorLaunchFailure,
                 absl::StrFormat("kernel of grid (%u, %u, %u) x block (%u, %u, %u): %s", grid.x,
                                 grid.y, grid.z, block.x, block.y, block.z, failure));
    }
  });
  if (e != cudaSuccess) SetError(e);
}

// ---- interpret.h ----------------------------------------------------------------------------

std::string DeviceName() { return "NVIDIA H200 (interpreted on the CPU)"; }

void SimulateMissingDriver(bool missing) { missing_driver.store(missing); }

std::string LastFailure() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().last_failure;
}

Counters GetCounters() { return {kernel_launches.load(), graph_launches.load(), gemms.load()}; }

}  // namespace prefixd::cuda_interpret

// ---- runtime_api.h --------------------------------------------------------------------------

using prefixd::cuda_interpret::Enqueue;
using prefixd::cuda_interpret::InDeviceAllocation;
using prefixd::cuda_interpret::S;
using prefixd::cuda_interpret::SetError;
using prefixd::cuda_interpret::StickyError;
namespace ci = prefixd::cuda_interpret;

const char* cudaGetErrorName(cudaError_t error) { return ci::ErrorName(error, false); }
const char* cudaGetErrorString(cudaError_t error) { return ci::ErrorName(error, true); }

cudaError_t cudaGetLastError() {
  if (const cudaError_t sticky = StickyError(); sticky != cudaSuccess) return sticky;
  const cudaError_t e = ci::last_error;
  ci::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  if (const cudaError_t sticky = StickyError(); sticky != cudaSuccess) return sticky;
  return ci::last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (ci::DriverMissing()) return cudaErrorInsufficientDriver;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (ci::DriverMissing()) return cudaErrorInsufficientDriver;
  *device = ci::current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (device != 0) return SetError(cudaErrorInvalidDevice);
  ci::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (ci::DriverMissing()) return cudaErrorInsufficientDriver;
  if (device != 0) return SetError(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = ci::kMaxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(ci::kSharedBytesPerBlock);
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = ci::kSmCount;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
  }
  return SetError(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (ci::RefusedDuringCapture("cudaDeviceSynchronize")) {
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(S().mu);
  *total_bytes = ci::DeclaredMemory();
  *free_bytes = ci::DeclaredMemory() - S().device_bytes;
  return cudaSuccess;
}

namespace {

cudaError_t Allocate(void** ptr, size_t bytes, bool device) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (device && ci::RefusedDuringCapture("cudaMalloc")) {
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  {
    std::lock_guard<std::mutex> lock(S().mu);
    const size_t limit = device
                             ? ci::DeclaredMemory() - S().device_bytes
                             : static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    if (bytes > limit) return SetError(cudaErrorMemoryAllocation);
    if (device) S().device_bytes += bytes;  // reserved before the allocation, given back below
  }
  void* p = ::operator new (bytes, std::align_val_t{ci::kAllocationAlign}, std::nothrow);
  std::lock_guard<std::mutex> lock(S().mu);
  if (p == nullptr) {
    if (device) S().device_bytes -= bytes;
    return SetError(cudaErrorMemoryAllocation);
  }
  // Memory nobody wrote reads as NaN (any float format) and -1 (int32), as loudly as possible.
  if (device) std::memset(p, 0xff, bytes);
  S().allocations[reinterpret_cast<uintptr_t>(p)] = {bytes, device};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Release(void* ptr, bool device) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (ptr == nullptr) return cudaSuccess;
  if (device && ci::RefusedDuringCapture("cudaFree")) {
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  std::lock_guard<std::mutex> lock(S().mu);
  auto it = S().allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == S().allocations.end() || it->second.device != device) {
    S().last_failure = absl::StrFormat("%s of %p, which is no %s allocation's start",
                                       device ? "cudaFree" : "cudaFreeHost", ptr,
                                       device ? "device" : "pinned host");
    return SetError(cudaErrorInvalidValue);
  }
  if (device) S().device_bytes -= it->second.bytes;
  S().allocations.erase(it);
  ::operator delete (ptr, std::align_val_t{ci::kAllocationAlign});
  return cudaSuccess;
}

cudaError_t Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                 bool sync) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (sync && ci::RefusedDuringCapture("cudaMemcpy")) {
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  if (const cudaError_t e = ci::CheckCopy(dst, src, bytes, kind); e != cudaSuccess) {
    return SetError(e);
  }
  if (bytes == 0) return cudaSuccess;
  return SetError(Enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); }));
}

cudaError_t Set(void* ptr, int value, size_t bytes, cudaStream_t stream, bool sync) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (sync && ci::RefusedDuringCapture("cudaMemset")) {
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  if (bytes == 0) return cudaSuccess;
  if (!InDeviceAllocation(ptr, bytes)) {
    ci::RecordFailure(absl::StrFormat(
        "cudaMemset of %d bytes at %p reaches outside every device allocation", bytes, ptr));
    return SetError(cudaErrorInvalidValue);
  }
  return SetError(Enqueue(stream, [ptr, value, bytes] { std::memset(ptr, value, bytes); }));
}

}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t bytes) { return Allocate(ptr, bytes, true); }
cudaError_t cudaFree(void* ptr) { return Release(ptr, true); }
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return Allocate(ptr, bytes, false); }
cudaError_t cudaFreeHost(void* ptr) { return Release(ptr, false); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return Copy(dst, src, bytes, kind, nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return Copy(dst, src, bytes, kind, stream, false);
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  return Set(ptr, value, bytes, nullptr, true);
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return Set(ptr, value, bytes, stream, false);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  *stream = new CUstream_st;
  (*stream)->flags = flags;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return SetError(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(S().mu);
    S().captures.erase(stream);
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(S().mu);
  if (stream != nullptr && stream->capturing) {
    stream->invalidated = true;
    S().last_failure = "cudaStreamSynchronize of a stream being captured";
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (stream == nullptr) return SetError(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(S().mu);
  if (stream->capturing) return SetError(cudaErrorIllegalState);
  stream->capturing = true;
  stream->invalidated = false;
  stream->mode = mode;
  stream->captured.clear();
  stream->capture_thread = std::this_thread::get_id();
  if (mode != cudaStreamCaptureModeRelaxed) S().captures.insert(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (stream == nullptr) return SetError(cudaErrorIllegalState);
  std::lock_guard<std::mutex> lock(S().mu);
  if (!stream->capturing) return SetError(cudaErrorIllegalState);
  stream->capturing = false;
  S().captures.erase(stream);
  std::vector<ci::StreamWork> work = std::move(stream->captured);
  stream->captured.clear();
  if (stream->invalidated) {
    *graph = nullptr;
    return SetError(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(work)};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long /*flags*/) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (graph == nullptr) return SetError(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (const cudaError_t e = ci::Enter(); e != cudaSuccess) return e;
  if (exec == nullptr) return SetError(cudaErrorInvalidValue);
  return SetError(Enqueue(stream, [exec] {
    ci::graph_launches.fetch_add(1, std::memory_order_relaxed);
    for (const ci::StreamWork& w : exec->work) {
      if (StickyError() != cudaSuccess) return;
      w();
    }
  }));
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
