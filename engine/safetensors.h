// The safetensors container: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then
// the data region that the offsets index.
//
// ParseSafetensors() accepts a file only if, afterwards, every tensor's bytes lie inside the
// data region and the tensors tile it exactly: sorted by offset they start at 0, each begins
// where the previous ends (no overlap, no gap) and the last ends at the end of the file (no
// trailing garbage); each tensor's byte length is its element count times its dtype's size;
// and no object of the header repeats a key (the reference parser refuses that too).
// So a caller may read any tensor's [begin, end) without further checks.
#ifndef PREFIXD_ENGINE_SAFETENSORS_H_
#define PREFIXD_ENGINE_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/dtype.h"

namespace prefixd {

struct SafetensorsEntry {
  std::string name;
  // The weights' dtype when it is one prefixd computes with (F32, F16, BF16). The format's
  // other dtypes (BOOL, U8, I64, F64, ...) are parsed, and their byte lengths checked, with
  // `float_dtype` false and `dtype` meaningless: a checkpoint may carry such buffers (GPT-2's
  // causal-mask "attn.bias" was saved as uint8 by some versions), and the loader decides.
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Byte offsets relative to the start of the data region.
  uint64_t begin = 0;
  uint64_t end = 0;
  bool float_dtype = true;
  std::string dtype_name;  // as spelled in the file (set by ParseSafetensors)
};

struct SafetensorsFile {
  std::vector<SafetensorsEntry> tensors;  // in offset order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length: where the data region starts in the file
};

// Validates and indexes `file` (the whole file's bytes). `file_label` names the file in
// error messages, which are INVALID_ARGUMENT.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::Span<const std::byte> file,
                                                 std::string_view file_label);

// The same checks from the header alone: `file` holds at least the file's first 8 + N bytes
// (N its header length; more is ignored) and `file_size` is the whole file's size, so that
// a file can be judged before its data is read.
absl::StatusOr<SafetensorsFile> ParseSafetensorsHeader(absl::Span<const std::byte> file,
                                                       uint64_t file_size,
                                                       std::string_view file_label);
// N, from the file's first 8 bytes (little-endian).
uint64_t SafetensorsHeaderLength(absl::Span<const std::byte> first8);

// "F32" | "F16" | "BF16": the names safetensors uses.
std::string_view SafetensorsDTypeName(DType dtype);

// The first 8 + N bytes of a file holding `tensors` (offsets as given) and `metadata`; the
// JSON is padded with spaces to a multiple of 8 bytes, as the reference writer does, so the
// data region starts aligned.
std::string EncodeSafetensorsHeader(absl::Span<const SafetensorsEntry> tensors,
                                    const std::map<std::string, std::string>& metadata);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SAFETENSORS_H_
