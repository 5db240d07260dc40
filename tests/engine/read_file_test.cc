// OpenRegularFile / ReadWholeFile: each thing that can sit where a file should is reported
// as what it is, and nothing blocks.
#include "engine/read_file.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ReadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "prefixd_read_file_XXXXXX").string();
    PREFIXD_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(ReadFileTest, ReadsEveryByte) {
  const std::string bytes = std::string("a\0b\xff", 4) + std::string(200000, 'z');
  std::ofstream(Path("f"), std::ios::binary) << bytes;
  absl::StatusOr<std::string> got = ReadWholeFile(Path("f"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  std::ofstream(Path("empty"), std::ios::binary).flush();
  EXPECT_EQ(ReadWholeFile(Path("empty")).value(), "");
  fs::create_symlink(Path("f"), Path("link"));
  EXPECT_EQ(ReadWholeFile(Path("link")).value(), bytes);
  EXPECT_TRUE(CheckRegularFile(Path("link")).ok());
}

TEST_F(ReadFileTest, MissingIsNotFound) {
  absl::Status s = CheckRegularFile(Path("absent"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), Path("absent") + ": missing");
  EXPECT_EQ(ReadWholeFile(Path("absent")).status(), s);
}

TEST_F(ReadFileTest, DanglingSymlinkNamesItsTarget) {
  fs::create_symlink(Path("gone"), Path("link"));
  absl::Status s = CheckRegularFile(Path("link"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(Path("link") + ": missing (a symbolic link to \"" +
                                     Path("gone") + "\", which does not exist)"));
}

TEST_F(ReadFileTest, SymlinkLoopIsReportedAsALoop) {
  fs::create_symlink(Path("b"), Path("a"));
  fs::create_symlink(Path("a"), Path("b"));
  absl::Status s = CheckRegularFile(Path("a"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(Path("a") + ": a symbolic link loop"));
}

TEST_F(ReadFileTest, DirectoryIsReportedAsADirectory) {
  fs::create_directory(Path("d"));
  absl::Status s = ReadWholeFile(Path("d")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), Path("d") + ": is a directory, not a regular file");
}

TEST_F(ReadFileTest, FifoIsReportedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(Path("p").c_str(), 0600), 0);
  // No writer ever opens the FIFO: a blocking open would hang this test.
  absl::Status s = ReadWholeFile(Path("p")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), Path("p") + ": is a FIFO (named pipe), not a regular file");
}

TEST_F(ReadFileTest, CharacterDeviceIsReported) {
  absl::Status s = CheckRegularFile("/dev/null");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "/dev/null: is a character device, not a regular file");
}

TEST_F(ReadFileTest, UnreadableFileSaysWhy) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  std::ofstream(Path("secret")) << "x";
  fs::permissions(Path("secret"), fs::perms::none);
  absl::Status s = CheckRegularFile(Path("secret"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cannot open: Permission denied"));
}

TEST_F(ReadFileTest, PathBytesAreEscapedInMessages) {
  const std::string name = Path("bad\xff\x1b[2J");
  absl::Status s = CheckRegularFile(name);
  EXPECT_EQ(s.message(), Path("bad\\xff\\x1b[2J") + ": missing");
}

}  // namespace
}  // namespace prefixd
