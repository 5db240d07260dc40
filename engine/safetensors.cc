#include "engine/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/escape.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

using json = nlohmann::json;

// Debian's absl has its own string_view type; StrCat takes only that one.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::optional<DType> ParseSafetensorsDType(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return std::nullopt;
}

// Element size of the format's other dtypes, which are read only to be skipped; 0 if unknown.
uint64_t OtherDTypeSize(std::string_view s) {
  if (s == "BOOL" || s == "U8" || s == "I8" || s == "F8_E4M3" || s == "F8_E5M2") return 1;
  if (s == "U16" || s == "I16") return 2;
  if (s == "U32" || s == "I32") return 4;
  if (s == "U64" || s == "I64" || s == "F64") return 8;
  return 0;
}

// A JSON number that is a non-negative integer, as uint64.
std::optional<uint64_t> NonNegativeInteger(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
  return std::nullopt;
}

absl::Status Invalid(std::string_view file_label, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(ToAbsl(file_label), ": ", ToAbsl(problem)));
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const json& v,
                                            uint64_t data_size, std::string_view file_label) {
  const std::string where = absl::StrCat("tensor \"", EscapeBytes(name), "\"");
  if (!v.is_object()) return Invalid(file_label, absl::StrCat(where, " is not a JSON object"));
  SafetensorsEntry e;
  e.name = name;

  auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    return Invalid(file_label, absl::StrCat(where, " has no \"dtype\" string"));
  }
  const std::string dtype_name = dtype_it->get<std::string>();
  std::optional<DType> dtype = ParseSafetensorsDType(dtype_name);
  const uint64_t other_size = OtherDTypeSize(dtype_name);
  if (!dtype && other_size == 0) {
    return Invalid(file_label,
                   absl::StrCat(where, " has unknown dtype \"", EscapeBytes(dtype_name), "\""));
  }
  e.dtype = dtype.value_or(DType::kF32);
  e.float_dtype = dtype.has_value();
  e.dtype_name = dtype_name;
  const uint64_t element_size = dtype ? static_cast<uint64_t>(DTypeSize(*dtype)) : other_size;

  auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    return Invalid(file_label, absl::StrCat(where, " has no \"shape\" array"));
  }
  // Bound the element count so that count * element size cannot overflow.
  constexpr uint64_t kMaxElements = uint64_t{1} << 56;
  uint64_t numel = 1;
  for (const json& d : *shape_it) {
    std::optional<uint64_t> dim = NonNegativeInteger(d);
    if (!dim) {
      return Invalid(file_label,
                     absl::StrCat(where, " has a shape entry that is not a non-negative integer"));
    }
    // Each dimension on its own too: after a 0 the count stays 0 whatever follows, but the
    // shape is stored as int64.
    if (*dim > kMaxElements || (*dim != 0 && numel > kMaxElements / *dim)) {
      return Invalid(file_label, absl::StrCat(where, " has an impossibly large shape"));
    }
    numel *= *dim;
    e.shape.push_back(static_cast<int64_t>(*dim));
  }

  auto offsets_it = v.find("data_offsets");
  if (offsets_it == v.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return Invalid(file_label, absl::StrCat(where, " has no \"data_offsets\" pair"));
  }
  std::optional<uint64_t> begin = NonNegativeInteger((*offsets_it)[0]);
  std::optional<uint64_t> end = NonNegativeInteger((*offsets_it)[1]);
  if (!begin || !end) {
    return Invalid(file_label,
                   absl::StrCat(where, " has data_offsets that are not non-negative integers"));
  }
  if (*begin > *end || *end > data_size) {
    return Invalid(file_label,
                   absl::StrCat(where, " has data_offsets [", *begin, ", ", *end,
                                "] out of range (the data region holds ", data_size, " bytes)"));
  }
  const uint64_t expected = numel * element_size;
  if (*end - *begin != expected) {
    return Invalid(file_label,
                   absl::StrCat(where, " spans ", *end - *begin, " bytes but its shape [",
                                absl::StrJoin(e.shape, ", "), "] and dtype ",
                                EscapeBytes(dtype_name), " need ", expected));
  }
  e.begin = *begin;
  e.end = *end;
  return e;
}

}  // namespace

std::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI8:  // not a checkpoint type (engine/dtype.h)
      return "I8";
  }
  return "F32";
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::Span<const std::byte> file,
                                                 std::string_view file_label) {
  return ParseSafetensorsHeader(file, file.size(), file_label);
}

uint64_t SafetensorsHeaderLength(absl::Span<const std::byte> first8) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(first8[i]);
  }
  return header_len;
}

absl::StatusOr<SafetensorsFile> ParseSafetensorsHeader(absl::Span<const std::byte> file,
                                                       uint64_t file_size,
                                                       std::string_view file_label) {
  if (file_size < 8 || file.size() < 8) {
    return Invalid(file_label, absl::StrCat("file is ", file_size,
                                            " bytes, too short for the 8-byte header length"));
  }
  const uint64_t header_len = SafetensorsHeaderLength(file.first(8));
  if (header_len > file_size - 8 || header_len > file.size() - 8) {
    return Invalid(file_label,
                   absl::StrCat("header length ", header_len, " runs beyond the end of the file (",
                                file_size, " bytes)"));
  }
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  // nlohmann keeps the last of a repeated key, where the reference parser (serde) refuses the
  // file: a tensor or a field spelled twice would be read as one of its two meanings. So each
  // object's keys are collected while it is parsed.
  std::vector<std::set<std::string>> keys_by_object;
  std::optional<std::string> repeated_key;
  const json::parser_callback_t on_event = [&](int /*depth*/, json::parse_event_t event,
                                               json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys_by_object.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys_by_object.pop_back();
    } else if (event == json::parse_event_t::key && !keys_by_object.empty() &&
               !keys_by_object.back().insert(parsed.get<std::string>()).second && !repeated_key) {
      repeated_key = parsed.get<std::string>();
    }
    return true;
  };
  json header = json::parse(header_begin, header_begin + header_len, on_event,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) return Invalid(file_label, "header is not valid JSON");
  if (repeated_key) {
    return Invalid(file_label, absl::StrCat("key \"", EscapeBytes(*repeated_key),
                                            "\" appears twice in an object of the header"));
  }
  if (!header.is_object()) return Invalid(file_label, "header is not a JSON object");

  SafetensorsFile out;
  out.data_start = 8 + header_len;
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Invalid(file_label, "__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return Invalid(file_label, absl::StrCat("__metadata__ value \"", EscapeBytes(mk),
                                                  "\" is not a string"));
        }
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> entry = ParseEntry(key, value, data_size, file_label);
    if (!entry.ok()) return entry.status();
    out.tensors.push_back(*std::move(entry));
  }

  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t cursor = 0;
  for (const SafetensorsEntry& e : out.tensors) {
    if (e.begin < cursor) {
      return Invalid(file_label,
                     absl::StrCat("tensor \"", EscapeBytes(e.name), "\" [", e.begin, ", ", e.end,
                                  ") overlaps the previous tensor, which ends at ", cursor));
    }
    if (e.begin > cursor) {
      return Invalid(file_label, absl::StrCat("gap of ", e.begin - cursor,
                                              " bytes in the data region before tensor \"",
                                              EscapeBytes(e.name), "\""));
    }
    cursor = e.end;
  }
  if (cursor != data_size) {
    return Invalid(file_label, absl::StrCat("trailing garbage: ", data_size - cursor,
                                            " bytes after the last tensor"));
  }
  return out;
}

std::string EncodeSafetensorsHeader(absl::Span<const SafetensorsEntry> tensors,
                                    const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsEntry& e : tensors) {
    header[e.name] = {{"dtype", SafetensorsDTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  return out;
}

}  // namespace prefixd
