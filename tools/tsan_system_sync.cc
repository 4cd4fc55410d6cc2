// Makes the synchronization inside Debian's Abseil and gRPC visible to
// ThreadSanitizer.
//
// Debian builds its shared libraries without -fsanitize=thread. Abseil's own
// TSan annotations (ABSL_TSAN_MUTEX_*) are compiled out of
// libabsl_synchronization.so, so absl::Mutex locks and unlocks with atomics
// TSan never sees and every member guarded by an absl::Mutex looks racy; and
// gRPC hands a callback call's completions to the thread that runs the
// callback through a lock-free queue inside libgrpc.
//
// Under --config=tsan this library is linked into every binary
// (--custom_malloc, see .bazelrc). The executable's definitions below then
// take the place of the shared libraries' functions, for our calls and for
// the calls between the libraries (they go through the PLT). Each one tells
// TSan what the real function does for ordering, the way the library's own
// annotations would, and forwards to it (found with dlsym(RTLD_NEXT)):
//  - absl::Mutex, CondVar and Notification: lock, unlock, wait. gRPC's own
//    locks are absl::Mutex and absl::CondVar, so they count too.
//  - grpc_call_start_batch and grpc_completion_queue_next: an operation's
//    start happens before the callback that its completion runs, which is
//    the order gRPC guarantees and keeps with a queue TSan cannot see.
//
// While a real Abseil function runs TSan ignores memory accesses (the
// pre/post annotations bracket it), so a Condition that Abseil evaluates
// inside Lock/Unlock/Await is not checked. That loses reports, never adds
// any. Some real functions call others below through the PLT
// (LockWhenWithTimeout calls LockWhenWithDeadline); only the outermost call
// on a thread tells TSan anything, or the lock would be taken twice.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpc/grpc.h"

#if !defined(__SANITIZE_THREAD__) && defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define __SANITIZE_THREAD__ 1
#endif
#endif
#ifndef __SANITIZE_THREAD__
#error "tools:tsan_system_sync is for -fsanitize=thread builds only"
#endif

// TSan's dynamic annotations (tsan_interface_ann.cpp).
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}

namespace {

#if !ABSL_OPTION_USE_INLINE_NAMESPACE
#error "the mangled names below assume Abseil's inline namespace"
#endif
#define PAGEALLOC_TSAN_STR2(x) #x
#define PAGEALLOC_TSAN_STR(x) PAGEALLOC_TSAN_STR2(x)

// Returns the shared libraries' definition of the function `name`.
void* Real(const std::string& name) {
  void* real = dlsym(RTLD_NEXT, name.c_str());
  if (real == nullptr) {
    std::fprintf(stderr, "tsan_system_sync: %s not found: %s\n", name.c_str(),
                 dlerror());
    std::abort();
  }
  return real;
}

// Returns the shared library's definition of the absl:: function with the
// mangled name "_Z" `head` "4absl" <inline namespace> `rest`; `head` is "N",
// or "NK" for a const member function. The names are Itanium-mangled by hand;
// "NS0_" in them refers back to absl::<inline namespace>.
void* RealAbsl(const char* head, const char* rest) {
  const char* ns = PAGEALLOC_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return Real(std::string("_Z") + head + "4absl" +
              std::to_string(std::strlen(ns)) + ns + rest);
}

// The real function as a function of type Fn (the object pointer first, as
// the Itanium ABI passes `this`), looked up once.
#define REAL_WITH_HEAD(Fn, head, rest)                                   \
  ([] {                                                                  \
    static const auto real = reinterpret_cast<Fn>(RealAbsl(head, rest)); \
    return real;                                                         \
  }())
#define REAL(Fn, rest) REAL_WITH_HEAD(Fn, "N", rest)
#define REAL_CONST(Fn, rest) REAL_WITH_HEAD(Fn, "NK", rest)

constexpr unsigned kRead = __tsan_mutex_read_lock;

// GNU ld's bounds of the executable's code: ours, instrumented. Abseil and
// gRPC are shared libraries.
extern "C" char __executable_start[];
extern "C" char etext[];

// How many of the Mutex and CondVar functions below this thread is inside.
thread_local int tls_depth = 0;

// One call to one of them, from `caller` (its return address).
class Call {
 public:
  explicit Call(const void* caller)
      : outermost_(tls_depth++ == 0),
        from_library_(caller < __executable_start || caller >= etext) {}
  ~Call() { --tls_depth; }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Runs `annotate` (calls to TSan) on the outermost call only. For a lock
  // of Abseil's or gRPC's own, TSan learns the happens-before edges but not
  // the reads and writes it models on the lock's memory: those libraries
  // hand their objects between threads with atomics TSan cannot see, and it
  // would report their locks' lifetimes as races.
  template <typename Fn>
  void Annotate(Fn annotate) const {
    if (!outermost_) return;
    if (from_library_) {
      AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
      AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    annotate();
    if (from_library_) {
      AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
      AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    }
  }

 private:
  const bool outermost_;
  const bool from_library_;
};

// `lock` takes `mu` (a plain, read or when-condition lock; it holds the lock
// on return, whatever it returns).
template <typename Fn>
auto Locking(const void* caller, absl::Mutex* mu, unsigned flags, Fn lock) {
  Call call(caller);
  call.Annotate([&] { __tsan_mutex_pre_lock(mu, flags); });
  const auto result = lock();
  call.Annotate([&] { __tsan_mutex_post_lock(mu, flags, 0); });
  return result;
}

// `try_lock` may take `mu`; it returns whether it did.
template <typename Fn>
bool TryLocking(const void* caller, absl::Mutex* mu, unsigned flags,
                Fn try_lock) {
  Call call(caller);
  flags |= __tsan_mutex_try_lock;
  call.Annotate([&] { __tsan_mutex_pre_lock(mu, flags); });
  const bool locked = try_lock();
  if (!locked) flags |= __tsan_mutex_try_lock_failed;
  call.Annotate([&] { __tsan_mutex_post_lock(mu, flags, 0); });
  return locked;
}

template <typename Fn>
void Unlocking(const void* caller, absl::Mutex* mu, unsigned flags, Fn unlock) {
  Call call(caller);
  call.Annotate([&] { __tsan_mutex_pre_unlock(mu, flags); });
  unlock();
  call.Annotate([&] { __tsan_mutex_post_unlock(mu, flags); });
}

// `wait` releases `mu` while it blocks and holds it again when it returns
// (Await, CondVar::Wait): a release and an acquire for TSan.
template <typename Fn>
auto ReleasedWhile(const void* caller, absl::Mutex* mu, Fn wait) {
  Call call(caller);
  call.Annotate([&] { __tsan_mutex_pre_unlock(mu, 0); });
  const auto result = wait();
  call.Annotate([&] {
    __tsan_mutex_post_unlock(mu, 0);
    __tsan_mutex_pre_lock(mu, 0);
    __tsan_mutex_post_lock(mu, 0, 0);
  });
  return result;
}

// Abseil's Notification keeps its flag right after its Mutex; the inline
// HasBeenNotified() in our code reads it with an instrumented acquire load,
// so Notify() releases on that address. (The Notification functions reach
// the Mutex ones above through the PLT; they need no Call of their own.)
static_assert(sizeof(absl::Notification) ==
                  sizeof(absl::Mutex) + alignof(absl::Mutex),
              "absl::Notification is {Mutex, atomic<bool>}");
void* NotifiedFlag(const absl::Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n) +
                           sizeof(absl::Mutex));
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// Condition, Duration and Time are passed as the real functions take them.
using Cond = const Condition&;

Mutex::~Mutex() {
  Call(__builtin_return_address(0)).Annotate([&] {
    __tsan_mutex_destroy(this, 0);
  });
  REAL(void (*)(Mutex*), "5MutexD1Ev")(this);
}

void Mutex::Lock() {
  Locking(__builtin_return_address(0), this, 0, [&] {
    REAL(void (*)(Mutex*), "5Mutex4LockEv")(this);
    return true;
  });
}

void Mutex::ReaderLock() {
  Locking(__builtin_return_address(0), this, kRead, [&] {
    REAL(void (*)(Mutex*), "5Mutex10ReaderLockEv")(this);
    return true;
  });
}

bool Mutex::TryLock() {
  return TryLocking(__builtin_return_address(0), this, 0, [&] {
    return REAL(bool (*)(Mutex*), "5Mutex7TryLockEv")(this);
  });
}

bool Mutex::ReaderTryLock() {
  return TryLocking(__builtin_return_address(0), this, kRead, [&] {
    return REAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv")(this);
  });
}

void Mutex::Unlock() {
  Unlocking(__builtin_return_address(0), this, 0, [&] {
    REAL(void (*)(Mutex*), "5Mutex6UnlockEv")(this);
  });
}

void Mutex::ReaderUnlock() {
  Unlocking(__builtin_return_address(0), this, kRead, [&] {
    REAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv")(this);
  });
}

void Mutex::LockWhen(Cond cond) {
  Locking(__builtin_return_address(0), this, 0, [&] {
    REAL(void (*)(Mutex*, Cond), "5Mutex8LockWhenERKNS0_9ConditionE")
    (this, cond);
    return true;
  });
}

void Mutex::ReaderLockWhen(Cond cond) {
  Locking(__builtin_return_address(0), this, kRead, [&] {
    REAL(void (*)(Mutex*, Cond), "5Mutex14ReaderLockWhenERKNS0_9ConditionE")
    (this, cond);
    return true;
  });
}

bool Mutex::LockWhenWithTimeout(Cond cond, Duration timeout) {
  return Locking(__builtin_return_address(0), this, 0, [&] {
    return REAL(bool (*)(Mutex*, Cond, Duration),
                "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE")(
        this, cond, timeout);
  });
}

bool Mutex::ReaderLockWhenWithTimeout(Cond cond, Duration timeout) {
  return Locking(__builtin_return_address(0), this, kRead, [&] {
    return REAL(bool (*)(Mutex*, Cond, Duration),
                "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_"
                "8DurationE")(this, cond, timeout);
  });
}

bool Mutex::LockWhenWithDeadline(Cond cond, Time deadline) {
  return Locking(__builtin_return_address(0), this, 0, [&] {
    return REAL(bool (*)(Mutex*, Cond, Time),
                "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE")(
        this, cond, deadline);
  });
}

bool Mutex::ReaderLockWhenWithDeadline(Cond cond, Time deadline) {
  return Locking(__builtin_return_address(0), this, kRead, [&] {
    return REAL(
        bool (*)(Mutex*, Cond, Time),
        "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE")(
        this, cond, deadline);
  });
}

void Mutex::Await(Cond cond) {
  ReleasedWhile(__builtin_return_address(0), this, [&] {
    REAL(void (*)(Mutex*, Cond), "5Mutex5AwaitERKNS0_9ConditionE")(this, cond);
    return true;
  });
}

bool Mutex::AwaitWithTimeout(Cond cond, Duration timeout) {
  return ReleasedWhile(__builtin_return_address(0), this, [&] {
    return REAL(bool (*)(Mutex*, Cond, Duration),
                "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE")(
        this, cond, timeout);
  });
}

bool Mutex::AwaitWithDeadline(Cond cond, Time deadline) {
  return ReleasedWhile(__builtin_return_address(0), this, [&] {
    return REAL(bool (*)(Mutex*, Cond, Time),
                "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE")(
        this, cond, deadline);
  });
}

void CondVar::Wait(Mutex* mu) {
  ReleasedWhile(__builtin_return_address(0), mu, [&] {
    REAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE")(this, mu);
    return true;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  return ReleasedWhile(__builtin_return_address(0), mu, [&] {
    return REAL(bool (*)(CondVar*, Mutex*, Duration),
                "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE")(
        this, mu, timeout);
  });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  return ReleasedWhile(__builtin_return_address(0), mu, [&] {
    return REAL(bool (*)(CondVar*, Mutex*, Time),
                "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE")(this, mu,
                                                                     deadline);
  });
}

void Notification::Notify() {
  __tsan_release(NotifiedFlag(this));
  REAL(void (*)(Notification*), "12Notification6NotifyEv")(this);
}

// A waiter that finds the flag already set returns without touching the
// Mutex: it acquires what Notify() released.
void Notification::WaitForNotification() const {
  REAL_CONST(void (*)(const Notification*),
             "12Notification19WaitForNotificationEv")
  (this);
  __tsan_acquire(NotifiedFlag(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  const bool notified = REAL_CONST(
      bool (*)(const Notification*, Duration),
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE")(this,
                                                                       timeout);
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  const bool notified =
      REAL_CONST(bool (*)(const Notification*, Time),
                 "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE")(
          this, deadline);
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl

// gRPC's C API (libgrpc). The C++ library calls these through the PLT: every
// batch of operations starts in grpc_call_start_batch, and the thread that
// runs a callback call's callbacks takes each completion from
// grpc_completion_queue_next. The completion carries the batch's tag.
extern "C" grpc_call_error grpc_call_start_batch(grpc_call* call,
                                                 const grpc_op* ops,
                                                 size_t nops, void* tag,
                                                 void* reserved) {
  static const auto real = reinterpret_cast<grpc_call_error (*)(
      grpc_call*, const grpc_op*, size_t, void*, void*)>(
      Real("grpc_call_start_batch"));
  __tsan_release(tag);
  return real(call, ops, nops, tag, reserved);
}

extern "C" grpc_event grpc_completion_queue_next(grpc_completion_queue* cq,
                                                 gpr_timespec deadline,
                                                 void* reserved) {
  static const auto real = reinterpret_cast<grpc_event (*)(
      grpc_completion_queue*, gpr_timespec, void*)>(
      Real("grpc_completion_queue_next"));
  const grpc_event event = real(cq, deadline, reserved);
  if (event.type == GRPC_OP_COMPLETE) __tsan_acquire(event.tag);
  return event;
}

// Options TSan applies before TSAN_OPTIONS, which can override them.
extern "C" const char* __tsan_default_options() {
  // Debian's shared libraries are not instrumented; what they read and write
  // through intercepted functions (memcpy, free) is theirs to keep race-free,
  // and TSan cannot see how they synchronize it.
  return "ignore_noninstrumented_modules=1";
}
