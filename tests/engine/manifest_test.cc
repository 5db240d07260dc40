#include "engine/manifest.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "prefixd_manifest_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ / "model";
    fs::create_directories(dir_);
    for (std::string_view f : kManifestFiles) Write(std::string(f), "content of " + std::string(f));
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << bytes;
  }
  std::string Manifest() {
    absl::StatusOr<std::string> m = ComputeManifestSha256(dir_.string());
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : "";
  }

  fs::path root_;
  fs::path dir_;
};

TEST_F(ManifestTest, IsHexSha256AndDeterministic) {
  const std::string m = Manifest();
  EXPECT_EQ(m.size(), 64u);
  EXPECT_EQ(m.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(Manifest(), m);
}

TEST_F(ManifestTest, IsNameAndDigestOfEachFileInOrder) {
  std::array<Digest, 4> digests;
  for (size_t i = 0; i < 4; ++i) {
    digests[i] = Sha256Of("content of " + std::string(kManifestFiles[i]));
  }
  EXPECT_EQ(Manifest(), ManifestSha256(digests));
  std::swap(digests[2], digests[3]);  // vocab and merges swapped: another identity
  EXPECT_NE(Manifest(), ManifestSha256(digests));
}

TEST_F(ManifestTest, AnyChangedByteInAnyFileChangesIt) {
  const std::string base = Manifest();
  for (std::string_view f : kManifestFiles) {
    const std::string name(f);
    const std::string original = "content of " + name;
    for (size_t pos : {size_t{0}, original.size() / 2, original.size() - 1}) {
      std::string changed = original;
      changed[pos] ^= 0x01;
      Write(name, changed);
      EXPECT_NE(Manifest(), base) << name << " byte " << pos;
    }
    Write(name, original + " ");  // appended byte
    EXPECT_NE(Manifest(), base) << name;
    Write(name, original);
    EXPECT_EQ(Manifest(), base) << name;
  }
}

TEST_F(ManifestTest, RenamingTheDirectoryOrAddingOtherFilesKeepsIt) {
  const std::string base = Manifest();
  const fs::path renamed = root_ / "another-name";
  fs::rename(dir_, renamed);
  dir_ = renamed;
  EXPECT_EQ(Manifest(), base);
  Write("README.md", "not part of the identity");
  EXPECT_EQ(Manifest(), base);
}

TEST_F(ManifestTest, MissingFileIsNotFoundAndNamesIt) {
  fs::remove(dir_ / "merges.txt");
  absl::StatusOr<std::string> m = ComputeManifestSha256(dir_.string());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr("merges.txt"));
}

}  // namespace
}  // namespace prefixd
