// Small file helpers shared by the tests (header-only: every test target already has the
// source root on its include path).
#ifndef PREFIXD_TESTS_TESTING_FILES_H_
#define PREFIXD_TESTS_TESTING_FILES_H_

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace prefixd::testing {

// The whole file as bytes; empty when it cannot be opened (the caller's assertions then fail
// on the content, with the content in the message).
inline std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_TESTING_FILES_H_
