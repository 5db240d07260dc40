// PREFIXD_CHECK: an invariant check that stays on in release builds.
//
// absl 20220623 has no absl/log, so this is the project's one CHECK macro. A failed check
// means prefixd's own state is corrupt (never bad user input: that is an absl::Status), so it
// prints the condition and location and aborts.
#ifndef PREFIXD_BASE_CHECK_H_
#define PREFIXD_BASE_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define PREFIXD_CHECK(cond)                                                            \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] {                                                        \
      std::fprintf(stderr, "%s:%d: PREFIXD_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#define PREFIXD_CHECK_MSG(cond, msg)                                                   \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] {                                                        \
      std::fprintf(stderr, "%s:%d: PREFIXD_CHECK failed: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, (msg));                                                      \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#endif  // PREFIXD_BASE_CHECK_H_
