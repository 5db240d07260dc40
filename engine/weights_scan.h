// Finding NaN and infinity in weights. A checkpoint holding either serves NaN
// log-probabilities with status OK, so the loader scans every float tensor once and refuses
// the file. The scan reads each byte once and stops at the first hit.
#ifndef PREFIXD_ENGINE_WEIGHTS_SCAN_H_
#define PREFIXD_ENGINE_WEIGHTS_SCAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "engine/dtype.h"

namespace prefixd {

// The index of the first element of `bytes` (little-endian elements of `dtype`; a trailing
// partial element is ignored) that is NaN or ±infinity, or -1 when every one is finite.
int64_t FirstNonFinite(DType dtype, absl::Span<const std::byte> bytes);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_WEIGHTS_SCAN_H_
