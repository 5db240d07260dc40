#include "server/wire_field.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "engine/request_validation.h"

namespace prefixd {
namespace {

constexpr char kWireFieldPayload[] = "type.prefixd.dev/invalid-field";

}  // namespace

absl::Status WireFieldError(std::string_view field, const std::string& message) {
  return WithWireField(absl::InvalidArgumentError(message), field);
}

absl::Status WithWireField(absl::Status status, std::string_view field) {
  if (!status.ok()) status.SetPayload(kWireFieldPayload, absl::Cord(std::string(field)));
  return status;
}

std::string InvalidField(const absl::Status& status) {
  const auto field = status.GetPayload(kWireFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

absl::Status NameRequestField(const absl::Status& status, FieldNamer name) {
  const RequestField field = ErrorField(status);
  if (field == RequestField::kNone) return status;
  const std::string_view wire = name(field);
  return WithWireField(
      absl::Status(status.code(), absl::StrCat(std::string(wire), " ", status.message())), wire);
}

}  // namespace prefixd
