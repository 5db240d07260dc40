// Helpers for the CUDA tests: skipping without a device, device buffers, dtype rounding and
// the tolerance rule every kernel test states.
#ifndef PREFIXD_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define PREFIXD_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/tokenizer.h"  // Model's destructor needs the complete type
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "tools/random_model.h"

namespace prefixd::cuda_test {

// Every GPU test starts with this: it skips (never fails) where cudaGetDeviceCount fails,
// reporting CUDA's own error text.
#define PREFIXD_SKIP_WITHOUT_CUDA()                                   \
  do {                                                                \
    if (absl::Status s = ::prefixd::CudaDeviceAvailable(); !s.ok()) { \
      GTEST_SKIP() << s.message();                                    \
    }                                                                 \
  } while (0)

#define PREFIXD_ASSERT_CUDA(stmt) \
  ASSERT_EQ((stmt), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

// A new directory under gtest's temporary directory, unique to this process: ctest runs each
// test case of a binary as a process of its own, in parallel, so a fixed name would be
// written and removed by several at once. Empty if it cannot be made.
inline std::string UniqueTempDir(const std::string& stem) {
  std::string path = ::testing::TempDir() + "/" + stem + "-XXXXXX";
  return mkdtemp(path.data()) != nullptr ? path : std::string();
}

// A random model in the real GPT-2 layout (`config`, `seed`), written into a new directory of
// this process (*dir, for the suite to remove) and loaded; null after a failure, which is
// reported. For the backend tests' SetUpTestSuite.
inline Model* WriteAndLoadRandomModel(const ModelConfig& config, uint64_t seed,
                                      const std::string& stem, std::string* dir) {
  *dir = UniqueTempDir(stem);
  RandomModelOptions o;
  o.out_dir = *dir;
  o.config = config;
  o.seed = seed;
  o.dtype = DType::kF32;
  if (absl::Status s = WriteRandomModel(o); !s.ok()) {
    ADD_FAILURE() << s;
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*dir);
  if (!model.ok()) {
    ADD_FAILURE() << model.status();
    return nullptr;
  }
  return model->release();
}

// The backend tests' bound on a logits row: max |cuda - cpu| over the row relative to the
// row's largest |logit|. f32 1e-3; f16 3e-2 and bf16 6e-2, provisional until measured on a GPU
// (the interpreter measures about 1e-3 and 1e-2 on a full-size GPT-2: cuda_gpt2_test).
inline double LogitTolerance(DType t) {
  switch (t) {
    case DType::kF32:
      return 1e-3;
    case DType::kF16:
      return 3e-2;
    case DType::kBF16:
      return 6e-2;
    case DType::kI8:
      break;
  }
  return 0;
}

// |gpu - ref| <= abs + rel * |ref|, elementwise; NaN anywhere fails.
struct Tolerance {
  double abs;
  double rel;
};

// For kernels whose reference starts from the same dtype-rounded inputs and computes in
// fp32/fp64: the output rounding (half an ulp of the dtype: 2^-11 for f16, 2^-8 for bf16)
// dominates, doubled for the different summation order; fp32 gets a few ulps.
inline Tolerance KernelTolerance(DType t) {
  switch (t) {
    case DType::kF32:
      return {1e-5, 1e-5};
    case DType::kF16:
      return {1e-3, 1e-3};
    case DType::kBF16:
      return {8e-3, 8e-3};
    case DType::kI8:  // no CUDA kernel takes int8
      break;
  }
  return {0, 0};
}

inline std::vector<uint8_t> Encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[4 * i], &v[i], 4);
    } else {
      const uint16_t h = t == DType::kF16 ? FloatToHalf(v[i]) : FloatToBF16(v[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

inline std::vector<float> Decode(const std::vector<uint8_t>& b, DType t) {
  const size_t n = b.size() / DTypeSize(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[i], &b[4 * i], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[2 * i], 2);
      out[i] = t == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
    }
  }
  return out;
}

// The value the device stores for x in dtype t.
inline std::vector<float> Round(const std::vector<float>& v, DType t) {
  return Decode(Encode(v, t), t);
}

inline std::vector<float> RandomVector(size_t n, std::mt19937* rng, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// An owning device allocation (test code: failures are test failures, checked by callers
// through ok()).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    ok_ = cudaMalloc(&ptr_, bytes ? bytes : 1) == cudaSuccess;
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    if (ok_) ok_ = cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool ok() const { return ok_; }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) {
      ADD_FAILURE() << "download failed: " << cudaGetErrorString(cudaGetLastError());
    }
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool ok_ = false;
};

inline void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& ref, Tolerance tol,
                        const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double err = std::fabs(static_cast<double>(gpu[i]) - ref[i]);
    const double allowed = tol.abs + tol.rel * std::fabs(ref[i]);
    if (!(err <= allowed)) {  // NaN fails too
      if (bad == 0 || !(err <= worst)) {
        worst = err;
        worst_i = i;
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size()
                     << " elements out of tolerance; worst at " << worst_i << ": gpu "
                     << gpu[worst_i] << " ref " << ref[worst_i];
}

inline std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

}  // namespace prefixd::cuda_test

#endif  // PREFIXD_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
