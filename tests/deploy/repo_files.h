// What the deploy tests share: the repository's files, read by their path in it.
#ifndef PREFIXD_TESTS_DEPLOY_REPO_FILES_H_
#define PREFIXD_TESTS_DEPLOY_REPO_FILES_H_

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace prefixd::testing {

inline std::string RepoPath(const std::string& rel) {
  return std::string(PREFIXD_SOURCE_DIR) + "/" + rel;
}

// The file's contents; a failed expectation (and "") when it cannot be read.
inline std::string ReadRepoFile(const std::string& rel) {
  std::ifstream in(RepoPath(rel));
  EXPECT_TRUE(in.good()) << rel;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_DEPLOY_REPO_FILES_H_
