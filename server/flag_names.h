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

// Every value of the flag `name` (its absl name, with underscores) in normalized `args`, in
// order: "--name=v", "-name=v", or "--name v" / "-name v". absl keeps only the last value of
// a repeated flag; this is how a repeatable one (--adapter) sees them all. Nothing after a
// bare "--" counts.
std::vector<std::string> RepeatedFlagValues(const std::vector<std::string>& args,
                                            const std::string& name);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_FLAG_NAMES_H_
