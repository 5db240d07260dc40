// OpenRegularFile / ReadWholeFile: each thing that can sit where a file should is reported
// as what it is, and nothing blocks. ReadFileInto / ReadFilePrefixInto / WriteFileAtomically:
// whole files (or their first bytes) of prefixd's own, never read or written through a
// symbolic link.
#include "base/file.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
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
using ::testing::Not;

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

// The message names the path it was given, never where a link points: over the network
// (an adapter's lora_path) that would show a client paths it did not name.
TEST_F(ReadFileTest, DanglingSymlinkIsNamedNotItsTarget) {
  fs::create_symlink(Path("gone-target"), Path("link"));
  absl::Status s = CheckRegularFile(Path("link"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            Path("link") + ": missing (a symbolic link whose target does not exist)");
  EXPECT_THAT(s.message(), Not(HasSubstr("gone-target")));
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

std::string Contents(const std::string& path) {
  std::string out;
  EXPECT_EQ(ReadFileInto(path, &out), 0) << path;
  return out;
}

TEST_F(ReadFileTest, AtomicWriteReplacesTheFileWithTheGivenMode) {
  ASSERT_EQ(WriteFileAtomically(Path("f.tmp"), Path("f"), "first", 0600), 0);
  ASSERT_EQ(WriteFileAtomically(Path("f.tmp"), Path("f"), std::string(100000, 'x'), 0600), 0);
  EXPECT_EQ(Contents(Path("f")), std::string(100000, 'x'));
  EXPECT_FALSE(fs::exists(Path("f.tmp")));
  struct stat st;
  ASSERT_EQ(::stat(Path("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string out;
  EXPECT_EQ(ReadFileInto(Path("absent"), &out), ENOENT);
}

TEST_F(ReadFileTest, AtomicWriteNeverFollowsASymlinkAtEitherName) {
  std::ofstream(Path("outside")) << "keep";
  // A link planted at the temporary name: removed, not written through.
  fs::create_symlink(Path("outside"), Path("f.tmp"));
  ASSERT_EQ(WriteFileAtomically(Path("f.tmp"), Path("f"), "new", 0644), 0);
  EXPECT_EQ(Contents(Path("outside")), "keep");
  EXPECT_EQ(Contents(Path("f")), "new");
  // A link at the file's own name: the rename replaces the link, the target is untouched.
  fs::create_symlink(Path("outside"), Path("g"));
  ASSERT_EQ(WriteFileAtomically(Path("g.tmp"), Path("g"), "other", 0644), 0);
  EXPECT_EQ(Contents(Path("outside")), "keep");
  EXPECT_FALSE(fs::is_symlink(Path("g")));
  EXPECT_EQ(Contents(Path("g")), "other");
}

TEST_F(ReadFileTest, OwnFilesAreReadOnlyWhenRegularAndNotThroughALink) {
  std::ofstream(Path("f")) << "bytes";
  fs::create_symlink(Path("f"), Path("link"));
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  std::string out;
  EXPECT_EQ(ReadFileInto(Path("link"), &out), ELOOP);
  EXPECT_EQ(ReadFileInto(Path("fifo"), &out), EINVAL);  // not waited on
  EXPECT_EQ(ReadFileInto(dir_.string(), &out), EINVAL);
  EXPECT_EQ(Contents(Path("f")), "bytes");
}

TEST_F(ReadFileTest, APrefixReadStopsAtTheLimitOrTheEndAndKeepsTheSameRules) {
  std::ofstream(Path("f")) << "0123456789";
  fs::create_symlink(Path("f"), Path("link"));
  std::string out = "stale";
  ASSERT_EQ(ReadFilePrefixInto(Path("f"), 4, &out), 0);
  EXPECT_EQ(out, "0123");
  ASSERT_EQ(ReadFilePrefixInto(Path("f"), 100, &out), 0);  // shorter than the limit
  EXPECT_EQ(out, "0123456789");
  EXPECT_EQ(ReadFilePrefixInto(Path("link"), 4, &out), ELOOP);
  EXPECT_EQ(ReadFilePrefixInto(Path("absent"), 4, &out), ENOENT);
}

TEST_F(ReadFileTest, AFailedAtomicWriteLeavesTheOldFileAndNoTemporary) {
  ASSERT_EQ(WriteFileAtomically(Path("f.tmp"), Path("f"), "old", 0644), 0);
  // Renaming over a directory fails: the old bytes stay, the temporary goes.
  fs::create_directory(Path("d"));
  std::ofstream(Path("d/x")) << "x";
  EXPECT_NE(WriteFileAtomically(Path("d.tmp"), Path("d"), "new", 0644), 0);
  EXPECT_FALSE(fs::exists(Path("d.tmp")));
  EXPECT_TRUE(fs::is_directory(Path("d")));
  EXPECT_EQ(WriteFileAtomically(Path("missing/f.tmp"), Path("missing/f"), "x", 0644), ENOENT);
  EXPECT_EQ(Contents(Path("f")), "old");
}

}  // namespace
}  // namespace prefixd
