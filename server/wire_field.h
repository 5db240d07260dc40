// A refusal as a front end reports it: naming the field it concerns in that front end's own
// vocabulary (GenerateRequest's proto field names over gRPC, OpenAI's JSON names over HTTP).
//
// Two kinds of refusal reach a front end. Its own parse errors name the wire field directly
// (WireFieldError). The request rules' refusals (engine/request_validation.h) carry a
// RequestField and a message written to follow the field's name; NameRequestField gives them
// the first kind's shape by putting the front end's name for the field first. No message is
// ever searched or rewritten.
#ifndef PREFIXD_SERVER_WIRE_FIELD_H_
#define PREFIXD_SERVER_WIRE_FIELD_H_

#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/request.h"

namespace prefixd {

// INVALID_ARGUMENT naming the wire field `field` (e.g. an HTTP body's JSON key).
absl::Status WireFieldError(std::string_view field, const std::string& message);
// `status` naming the wire field `field` (a refusal of another code, e.g. NOT_FOUND).
absl::Status WithWireField(absl::Status status, std::string_view field);
// The wire field a refusal names (OpenAI's error `param`), or "" when it names none.
std::string InvalidField(const absl::Status& status);

// A front end's name for each request field.
using FieldNamer = absl::FunctionRef<std::string_view(RequestField)>;

// A refusal that carries a RequestField (engine/request_validation.h ErrorField) as its front
// end reports it: "<name> <message>", naming the wire field <name>. Any other status is
// returned as it is.
absl::Status NameRequestField(const absl::Status& status, FieldNamer name);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_WIRE_FIELD_H_
