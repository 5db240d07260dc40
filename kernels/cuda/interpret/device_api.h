// The device side of CUDA that the kernels of kernels/cuda use, for the interpreter: launch
// coordinates, qualifiers, __syncthreads, warp shuffles, atomics and math.
//
// Every thread of a block runs as a fiber of its own (scheduler.cc); the coordinates below
// are the running fiber's. `__shared__` variables are function-local statics of the OS
// thread that runs the block, so all threads of a block see one copy, as on a GPU: blocks of
// a launch run one after another. Static shared memory above the 48 KiB a block may hold is
// refused at compile time by nvcc (ptxas), so only the dynamic part is checked at launch.
#ifndef PREFIXD_KERNELS_CUDA_INTERPRET_DEVICE_API_H_
#define PREFIXD_KERNELS_CUDA_INTERPRET_DEVICE_API_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

// The running thread's coordinates, set by the scheduler before it resumes a thread.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace prefixd::cuda_interpret {
// Block-wide barrier: returns once every thread of the block has arrived. A barrier that
// some threads of the block can no longer reach (they exited) fails the launch.
void SyncThreads();
// Exchanges `bits` among the 32 lanes of the caller's warp: every lane of `mask` must call
// it, and `mask` must name whole, live warps (the kernels use 0xffffffff). Returns the
// value lane `src_lane` passed.
uint64_t WarpExchange(unsigned int mask, uint64_t bits, int src_lane);
inline int LaneId() {
  const unsigned int linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return static_cast<int>(linear % 32);
}
template <typename T>
T Shuffle(unsigned int mask, T v, int src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = WarpExchange(mask, bits, src_lane);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace prefixd::cuda_interpret

inline void __syncthreads() { prefixd::cuda_interpret::SyncThreads(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
  prefixd::cuda_interpret::WarpExchange(mask, 0, 0);
}

// `width` as CUDA's: lanes are grouped in segments of `width` (a power of two <= 32), and
// lane arguments are taken as PTX shfl takes them (the low 5 bits; an index modulo width by
// its bit mask, so -1 names the segment's last lane).
template <typename T>
T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32) {
  const int lane = prefixd::cuda_interpret::LaneId();
  int src = lane ^ (lane_mask & 31);
  // A later segment gives the caller's own value; an earlier one is read (CUDA's butterfly).
  if (src >= (lane / width + 1) * width) src = lane;
  return prefixd::cuda_interpret::Shuffle(mask, v, src);
}
template <typename T>
T __shfl_sync(unsigned int mask, T v, int src_lane, int width = 32) {
  const int lane = prefixd::cuda_interpret::LaneId();
  return prefixd::cuda_interpret::Shuffle(mask, v,
                                          (lane / width) * width + (src_lane & (width - 1)));
}
template <typename T>
T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
  const int lane = prefixd::cuda_interpret::LaneId();
  const int src = lane % width + static_cast<int>(delta) < width ? lane + delta : lane;
  return prefixd::cuda_interpret::Shuffle(mask, v, src);
}

// Atomics: the threads of a block switch only at barriers and shuffles, and blocks run one
// after another, so a plain read-modify-write is atomic here.
template <typename T>
T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = old + v;
  return old;
}
template <typename T>
T atomicMax(T* address, T v) {
  const T old = *address;
  *address = old < v ? v : old;
  return old;
}
template <typename T>
T atomicMin(T* address, T v) {
  const T old = *address;
  *address = v < old ? v : old;
  return old;
}
template <typename T>
T atomicExch(T* address, T v) {
  const T old = *address;
  *address = v;
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T v) {
  const T old = *address;
  if (old == compare) *address = v;
  return old;
}

// Math: CUDA's device functions of the same names where the host has none. rsqrtf is 1/sqrt
// rounded once more than CUDA's (within its documented 2 ulp).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a < b ? b : a; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a < b ? b : a; }

#endif  // PREFIXD_KERNELS_CUDA_INTERPRET_DEVICE_API_H_
