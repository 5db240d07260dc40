// cuBLAS's cublasGemmEx on the host (cublas_api.h), through OpenBLAS's sgemm.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cuda/interpret/cublas_api.h"
#include "kernels/cuda/interpret/half.h"
#include "kernels/cuda/interpret/runtime_internal.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

namespace prefixd::cuda_interpret {
namespace {

size_t TypeBytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

float Read(const void* base, int64_t i, cudaDataType t) {
  if (t == CUDA_R_32F) {
    float f;
    std::memcpy(&f, static_cast<const char*>(base) + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(base) + 2 * i, 2);
  return t == CUDA_R_16F ? HalfBitsToFloat(h) : BF16BitsToFloat(h);
}

void Write(void* base, int64_t i, cudaDataType t, float v) {
  if (t == CUDA_R_32F) {
    std::memcpy(static_cast<char*>(base) + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == CUDA_R_16F ? FloatToHalfBits(v) : FloatToBF16Bits(v);
  std::memcpy(static_cast<char*>(base) + 2 * i, &h, 2);
}

// The column-major `rows` x `cols` matrix at `p` with leading dimension `ld`, as packed floats.
std::vector<float> Unpack(const void* p, cudaDataType t, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r)
      out[static_cast<size_t>(c) * rows + r] = Read(p, int64_t{c} * ld + r, t);
  }
  return out;
}

// The bytes a column-major rows x cols matrix with leading dimension ld spans.
size_t Span(int rows, int cols, int ld, cudaDataType t) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * ld + rows) * TypeBytes(t);
}

bool Supported(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

}  // namespace
}  // namespace prefixd::cuda_interpret

namespace ci = prefixd::cuda_interpret;

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (ci::DriverMissing()) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && !ci::InDeviceAllocation(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  *version = 0;  // no cuBLAS: the interpreter's products are OpenBLAS's
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "an error was detected when checking the current licensing";
  }
  return "unknown error";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t /*algo*/) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (ci::DriverMissing() || ci::StickyError() != cudaSuccess) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  // cuBLAS's argument checks (CUBLAS_OP_C is CUBLAS_OP_T for real types).
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int b_rows = tb ? n : k, b_cols = tb ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m) || alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (Atype != Btype || !ci::Supported(Atype) || (Ctype != CUDA_R_32F && Ctype != Atype) ||
      (compute_type != CUBLAS_COMPUTE_32F && compute_type != CUBLAS_COMPUTE_32F_PEDANTIC)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Operands outside device memory would be illegal addresses on a GPU.
  const size_t a_span = ci::Span(a_rows, a_cols, lda, Atype);
  const size_t b_span = ci::Span(b_rows, b_cols, ldb, Btype);
  const size_t c_span = ci::Span(m, n, ldc, Ctype);
  if ((a_span > 0 && !ci::InDeviceAllocation(A, a_span)) ||
      (b_span > 0 && !ci::InDeviceAllocation(B, b_span)) || !ci::InDeviceAllocation(C, c_span)) {
    ci::FailSticky(cudaErrorIllegalAddress,
                   absl::StrFormat("cublasGemmEx m=%d n=%d k=%d lda=%d ldb=%d ldc=%d: an operand "
                                   "reaches outside its device allocation",
                                   m, n, k, lda, ldb, ldc));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const bool device_scalars = handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
  float host_alpha = 0, host_beta = 0;
  if (!device_scalars) {
    std::memcpy(&host_alpha, alpha, 4);
    std::memcpy(&host_beta, beta, 4);
  }
  auto work = [=] {
    ci::CountGemm();
    float al = host_alpha, be = host_beta;
    if (device_scalars) {  // read when the product runs, as on the device
      std::memcpy(&al, alpha, 4);
      std::memcpy(&be, beta, 4);
    }
    std::vector<float> c(static_cast<size_t>(m) * n, 0.0f);
    if (be != 0.0f) {  // C is not read when beta is 0 (it may hold NaN)
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < m; ++i)
          c[static_cast<size_t>(j) * m + i] = ci::Read(C, int64_t{j} * ldc + i, Ctype);
      }
    }
    if (k > 0) {
      const std::vector<float> a = ci::Unpack(A, Atype, a_rows, a_cols, lda);
      const std::vector<float> b = ci::Unpack(B, Btype, b_rows, b_cols, ldb);
      cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                  n, k, al, a.data(), std::max(1, a_rows), b.data(), std::max(1, b_rows), be,
                  c.data(), m);
    } else {
      for (float& v : c) v *= be;
    }
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i)
        ci::Write(C, int64_t{j} * ldc + i, Ctype, c[static_cast<size_t>(j) * m + i]);
    }
  };
  if (ci::Enqueue(handle->stream, work) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}
