// Why this file exists: Debian's civetweb 1.15 (the HTTP server under prometheus-cpp's
// Exposer) starts its threads with a small stack size compiled into the library. glibc
// carves each thread's static TLS out of its stack, and cuBLASLt alone has ~94 KiB of static
// TLS, so in a prefixd that links the CUDA backend every civetweb pthread_create fails with
// EINVAL ("Cannot create threads") and /metrics cannot start. civetweb has no option for its
// stack size, so prefixd interposes pthread_attr_setstacksize (exported from the executable,
// see server/CMakeLists.txt) and raises any request below kStackFloor to it. Larger requests,
// and threads that never set a size, are unaffected.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr size_t kStackFloor = size_t{1} << 20;  // 1 MiB: TLS of every linked library + room

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn RealSetStackSize() {
  static const SetStackSizeFn real =
      reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) noexcept {
  return RealSetStackSize()(attr, std::max(stacksize, kStackFloor));
}
