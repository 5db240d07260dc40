// Fuzz target: a whole model.safetensors file's bytes → ParseSafetensors.
//
// An accepted file must keep the parser's promise (safetensors.h): the tensors tile the data
// region exactly and each length is its element count times its dtype's size. Its float
// tensors then go through the loader's NaN/infinity scan, checked against a scalar
// reference; and a header re-encoded by EncodeSafetensorsHeader parses back to the same
// tensors.
#include <cmath>
#include <string>

#include "engine/dtype.h"
#include "engine/safetensors.h"
#include "engine/weights_scan.h"
#include "fuzz/fuzz_target.h"

namespace prefixd::fuzz {
namespace {

int64_t FirstNonFiniteReference(const SafetensorsEntry& e, const std::byte* data) {
  const int64_t n = static_cast<int64_t>(e.end - e.begin) / DTypeSize(e.dtype);
  for (int64_t i = 0; i < n; ++i) {
    float f;
    if (e.dtype == DType::kF32) {
      std::memcpy(&f, data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      f = e.dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
    }
    if (!std::isfinite(f)) return i;
  }
  return -1;
}

void CheckParsed(const SafetensorsFile& st, absl::Span<const std::byte> file) {
  PREFIXD_CHECK(st.data_start >= 8 && st.data_start <= file.size());
  uint64_t cursor = 0;
  bool all_float = true;
  for (const SafetensorsEntry& e : st.tensors) {
    PREFIXD_CHECK(e.begin == cursor);
    PREFIXD_CHECK(e.end >= e.begin);
    cursor = e.end;
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      PREFIXD_CHECK(d >= 0);
      numel *= static_cast<uint64_t>(d);
    }
    if (!e.float_dtype) {
      all_float = false;
      continue;
    }
    PREFIXD_CHECK(numel * static_cast<uint64_t>(DTypeSize(e.dtype)) == e.end - e.begin);
    const std::byte* data = file.data() + st.data_start + e.begin;
    PREFIXD_CHECK(FirstNonFinite(e.dtype, {data, e.end - e.begin}) ==
                  FirstNonFiniteReference(e, data));
  }
  PREFIXD_CHECK(st.data_start + cursor == file.size());

  // The writer's header (float dtypes only) reads back as the same index.
  if (!all_float) return;
  std::string again = EncodeSafetensorsHeader(st.tensors, st.metadata);
  again.append(reinterpret_cast<const char*>(file.data() + st.data_start),
               file.size() - st.data_start);
  absl::StatusOr<SafetensorsFile> reparsed = ParseSafetensors(
      {reinterpret_cast<const std::byte*>(again.data()), again.size()}, "re-encoded");
  PREFIXD_CHECK(reparsed.ok());
  PREFIXD_CHECK(reparsed->tensors.size() == st.tensors.size());
  PREFIXD_CHECK(reparsed->metadata == st.metadata);
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const SafetensorsEntry& a = st.tensors[i];
    const SafetensorsEntry& b = reparsed->tensors[i];
    PREFIXD_CHECK(a.dtype == b.dtype && a.shape == b.shape);
    PREFIXD_CHECK(a.end - a.begin == b.end - b.begin);
  }
}

}  // namespace
}  // namespace prefixd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  absl::StatusOr<prefixd::SafetensorsFile> st =
      prefixd::ParseSafetensors(file, "model.safetensors");
  if (st.ok()) prefixd::fuzz::CheckParsed(*st, file);
  return 0;
}
