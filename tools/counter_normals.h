// Counter-based random numbers for the model and adapter writers: a tensor's element i
// depends only on (key, i), so tensors can be generated in any order and any chunking, and a
// seed gives the same bytes on every machine.
#ifndef PREFIXD_TOOLS_COUNTER_NORMALS_H_
#define PREFIXD_TOOLS_COUNTER_NORMALS_H_

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace prefixd::internal {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1]: never 0, so log() below is finite.
inline double Uniform(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

// Standard normals: Box-Muller turns the pair of uniforms at counters 2j, 2j+1 into the
// normals of elements 2j and 2j+1.
inline void FillNormal(uint64_t key, std::vector<float>* out) {
  const size_t n = out->size();
  for (size_t j = 0; 2 * j < n; ++j) {
    const double r = std::sqrt(-2.0 * std::log(Uniform(SplitMix64(key + 2 * j))));
    const double theta = 2.0 * M_PI * Uniform(SplitMix64(key + 2 * j + 1));
    (*out)[2 * j] = static_cast<float>(r * std::cos(theta));
    if (2 * j + 1 < n) (*out)[2 * j + 1] = static_cast<float>(r * std::sin(theta));
  }
}

}  // namespace prefixd::internal

#endif  // PREFIXD_TOOLS_COUNTER_NORMALS_H_
