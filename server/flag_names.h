// absl flag names are C++ identifiers (kv_cache_bytes), but prefixd's documented flags use
// dashes (--kv-cache-bytes). This rewrites the name part of every "--flag[=value]" argument
// before absl parses it, so both spellings work; values and positional arguments are left
// alone, and nothing after a bare "--" is touched.
#ifndef PREFIXD_SERVER_FLAG_NAMES_H_
#define PREFIXD_SERVER_FLAG_NAMES_H_

#include <string>
#include <vector>

namespace prefixd {

std::vector<std::string> NormalizeFlagNames(const std::vector<std::string>& args);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_FLAG_NAMES_H_
