// Built only with PREFIXD_TSAN (scripts/tsan): makes Debian's prebuilt, uninstrumented
// absl::Mutex and absl::Notification visible to ThreadSanitizer. The root CMakeLists.txt links
// every program with -Wl,--wrap=<symbol> for each function below, so that every call to them
// goes through a wrapper that reports it with TSan's mutex annotations (happens-before and
// lock-order inversions), as absl does when it is itself built with -fsanitize=thread. Between
// the pre and post annotations TSan ignores memory accesses: the Conditions absl evaluates
// there (on whichever thread holds the lock) only read guarded state. The symbols are absl
// 20220623's as Debian 12 builds it (inline namespace debian3).
#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

namespace {
// Notification::notified_yet_ follows its Mutex; HasBeenNotified() loads it inline (acquire).
void* NotifiedYet(const Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(Mutex));
}
void Locked(Mutex* m, unsigned flags) {
  __tsan_mutex_post_lock(m, flags, 0);
}
void BeforeWait(Mutex* m, unsigned flags) {  // Await releases the lock while it waits
  __tsan_mutex_pre_unlock(m, flags);
  __tsan_mutex_post_unlock(m, flags);
  __tsan_ignore_thread_begin();
}
void AfterWait(Mutex* m, unsigned flags) {
  __tsan_ignore_thread_end();
  __tsan_mutex_pre_lock(m, flags);
  __tsan_mutex_post_lock(m, flags, 0);
}
}  // namespace

extern "C" {
#define REAL(sym, ret, ...) ret __real_##sym(__VA_ARGS__)
REAL(_ZN4absl7debian35MutexD1Ev, void, Mutex*);
void __wrap__ZN4absl7debian35MutexD1Ev(Mutex* m) {
  __real__ZN4absl7debian35MutexD1Ev(m);
  __tsan_mutex_destroy(m, 0);
}
REAL(_ZN4absl7debian35Mutex4LockEv, void, Mutex*);
void __wrap__ZN4absl7debian35Mutex4LockEv(Mutex* m) {
  __tsan_mutex_pre_lock(m, 0);
  __real__ZN4absl7debian35Mutex4LockEv(m);
  Locked(m, 0);
}
REAL(_ZN4absl7debian35Mutex6UnlockEv, void, Mutex*);
void __wrap__ZN4absl7debian35Mutex6UnlockEv(Mutex* m) {
  __tsan_mutex_pre_unlock(m, 0);
  __real__ZN4absl7debian35Mutex6UnlockEv(m);
  __tsan_mutex_post_unlock(m, 0);
}
REAL(_ZN4absl7debian35Mutex7TryLockEv, bool, Mutex*);
bool __wrap__ZN4absl7debian35Mutex7TryLockEv(Mutex* m) {
  __tsan_mutex_pre_lock(m, __tsan_mutex_try_lock);
  const bool ok = __real__ZN4absl7debian35Mutex7TryLockEv(m);
  __tsan_mutex_post_lock(m, ok ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
  return ok;
}
REAL(_ZN4absl7debian35Mutex10ReaderLockEv, void, Mutex*);
void __wrap__ZN4absl7debian35Mutex10ReaderLockEv(Mutex* m) {
  __tsan_mutex_pre_lock(m, __tsan_mutex_read_lock);
  __real__ZN4absl7debian35Mutex10ReaderLockEv(m);
  Locked(m, __tsan_mutex_read_lock);
}
REAL(_ZN4absl7debian35Mutex12ReaderUnlockEv, void, Mutex*);
void __wrap__ZN4absl7debian35Mutex12ReaderUnlockEv(Mutex* m) {
  __tsan_mutex_pre_unlock(m, __tsan_mutex_read_lock);
  __real__ZN4absl7debian35Mutex12ReaderUnlockEv(m);
  __tsan_mutex_post_unlock(m, __tsan_mutex_read_lock);
}
REAL(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE, void, Mutex*, const Condition&);
void __wrap__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(Mutex* m, const Condition& c) {
  BeforeWait(m, 0);
  __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(m, c);
  AfterWait(m, 0);
}
REAL(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE, bool, Mutex*,
     const Condition&, Duration);
bool __wrap__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    Mutex* m, const Condition& c, Duration d) {
  BeforeWait(m, 0);
  const bool r =
      __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(m, c, d);
  AfterWait(m, 0);
  return r;
}
REAL(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE, bool, Mutex*,
     const Condition&, Time);
bool __wrap__ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(
    Mutex* m, const Condition& c, Time t) {
  BeforeWait(m, 0);
  const bool r =
      __real__ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(m, c, t);
  AfterWait(m, 0);
  return r;
}
REAL(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE, void, Mutex*, const Condition&);
void __wrap__ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(Mutex* m, const Condition& c) {
  __tsan_mutex_pre_lock(m, 0);
  __real__ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(m, c);
  Locked(m, 0);
}
REAL(_ZN4absl7debian312Notification6NotifyEv, void, Notification*);
void __wrap__ZN4absl7debian312Notification6NotifyEv(Notification* n) {
  __tsan_release(n);
  __tsan_release(NotifiedYet(n));
  __tsan_ignore_thread_begin();
  __real__ZN4absl7debian312Notification6NotifyEv(n);
  __tsan_ignore_thread_end();
}
REAL(_ZNK4absl7debian312Notification19WaitForNotificationEv, void, const Notification*);
void __wrap__ZNK4absl7debian312Notification19WaitForNotificationEv(const Notification* n) {
  __tsan_ignore_thread_begin();
  __real__ZNK4absl7debian312Notification19WaitForNotificationEv(n);
  __tsan_ignore_thread_end();
  __tsan_acquire(const_cast<Notification*>(n));
}
REAL(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE, bool,
     const Notification*, Duration);
bool __wrap__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
    const Notification* n, Duration d) {
  __tsan_ignore_thread_begin();
  const bool r =
      __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(n, d);
  __tsan_ignore_thread_end();
  if (r) __tsan_acquire(const_cast<Notification*>(n));
  return r;
}
REAL(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE, bool,
     const Notification*, Time);
bool __wrap__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(
    const Notification* n, Time t) {
  __tsan_ignore_thread_begin();
  const bool r =
      __real__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(n, t);
  __tsan_ignore_thread_end();
  if (r) __tsan_acquire(const_cast<Notification*>(n));
  return r;
}
}
