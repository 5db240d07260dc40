// The model manifest: the identity every cached KV block is keyed by (docs/ARCHITECTURE.md).
//
// manifest = SHA-256 over, for each of kManifestFiles in that order, the file's name
// (length-prefixed) followed by the SHA-256 of its content. The directory's own name and any
// other file in it are not part of it, so a renamed copy keeps its identity while a change
// to any byte of config, weights or tokenizer gives a new one.
#ifndef PREFIXD_ENGINE_MANIFEST_H_
#define PREFIXD_ENGINE_MANIFEST_H_

#include <array>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/sha256.h"

namespace prefixd {

inline constexpr std::array<std::string_view, 4> kManifestFiles = {
    "config.json", "model.safetensors", "vocab.json", "merges.txt"};

// `file_digests[i]` is the SHA-256 of kManifestFiles[i]'s content. Returns lowercase hex.
std::string ManifestSha256(const std::array<Digest, 4>& file_digests);

// SHA-256 of a file's content, read in chunks. NOT_FOUND / INVALID_ARGUMENT name the path.
absl::StatusOr<Digest> FileSha256(const std::string& path);

// Reads the four files of `dir` and returns their manifest.
absl::StatusOr<std::string> ComputeManifestSha256(const std::string& dir);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_MANIFEST_H_
