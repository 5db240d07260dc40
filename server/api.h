// The front end a request came through. In a header of its own so that front ends and fuzz
// targets name it without compiling the metrics (prometheus) headers.
#ifndef PREFIXD_SERVER_API_H_
#define PREFIXD_SERVER_API_H_

#include <string_view>

namespace prefixd {

// The `api` label of prefixd_requests_total.
enum class Api { kGrpc, kHttp };

inline const char* ApiName(Api api) { return api == Api::kGrpc ? "grpc" : "http"; }

// The `adapter` label of a request that named no loaded adapter, or was refused before its
// body was read (server/metrics.h). No adapter or model name is empty.
inline constexpr std::string_view kUnresolvedAdapter = "";

}  // namespace prefixd

#endif  // PREFIXD_SERVER_API_H_
