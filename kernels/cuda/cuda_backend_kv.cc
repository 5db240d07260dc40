// The CUDA backend's K/V block operations (the class and its invariants are in
// cuda_backend_impl.h): block copies within the pool, and whole blocks read to and written
// from the host (the disk tier's transfers).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "kernels/cuda/block_copy.cuh"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_check.h"

namespace prefixd::cuda {

absl::Status CudaBackend::RunCopyBlocks(absl::Span<const BlockCopy> copies) {
  if (!broken_.ok()) return broken_;
  auto run = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    // One launch runs its copies in parallel; the contract runs them in order, so a copy
    // that touches a block an earlier one writes (or writes one it reads) starts a new launch.
    size_t begin = 0;
    for (const size_t end : IndependentCopyBatchEnds(copies, kMaxCopiesPerLaunch)) {
      const size_t n = end - begin;
      for (size_t i = 0; i < n; ++i) {
        h_copies_[3 * i] = copies[begin + i].src;
        h_copies_[3 * i + 1] = copies[begin + i].dst;
        h_copies_[3 * i + 2] = copies[begin + i].num_rows;
      }
      PREFIXD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(d_copies_, h_copies_, n * 3 * 4, cudaMemcpyHostToDevice, stream_));
      PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchBlockCopy(
          options_.dtype, d_copies_, static_cast<int32_t>(n), layout_, kv_pool_, stream_));
      // The pinned staging buffer is reused by the next launch.
      PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      begin = end;
    }
    return absl::OkStatus();
  };
  absl::Status s = run();
  return s.ok() ? s : Fail(s);
}

// A block is one contiguous range of the pool (kv_pool_layout.h), already in the byte layout
// the interface promises. The copies run on stream_, so they are ordered after every copy and
// Forward enqueued before; the host buffer is pageable, hence the synchronisation before
// returning (the caller may reuse or free it at once).
absl::Status CudaBackend::RunReadKvBlock(int32_t block, absl::Span<uint8_t> out) {
  if (!broken_.ok()) return broken_;
  auto run = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    const char* src = static_cast<const char*>(kv_pool_) + int64_t{block} * KvBlockBytes();
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out.data(), src, out.size(), cudaMemcpyDeviceToHost, stream_));
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  };
  absl::Status s = run();
  return s.ok() ? s : Fail(s);
}

absl::Status CudaBackend::RunWriteKvBlock(int32_t block, absl::Span<const uint8_t> data) {
  if (!broken_.ok()) return broken_;
  auto run = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    char* dst = static_cast<char*>(kv_pool_) + int64_t{block} * KvBlockBytes();
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, data.data(), data.size(), cudaMemcpyHostToDevice, stream_));
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  };
  absl::Status s = run();
  return s.ok() ? s : Fail(s);
}

}  // namespace prefixd::cuda
