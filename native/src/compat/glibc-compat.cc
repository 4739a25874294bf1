// glibc floor for the shipped x86_64 and aarch64 addons (docs/dependencies.md, "glibc floor").
//
// binding.gyp links libstdc++/libgcc statically and passes -Wl,--wrap=SYMBOL for each
// symbol below: every call to SYMBOL in our objects and in libstdc++.a goes to
// __wrap_SYMBOL, which calls the oldest version of it (GLIBC_2.2.5 on x86_64, GLIBC_2.17
// on aarch64) or emulates it, so no dynamic symbol needs a version newer than GLIBC_2.28
// (x86_64) or GLIBC_2.17 (aarch64). The build host's glibc (2.36
// on Debian 12) still provides those old versions. test/package/prebuild-symbols.test.ts
// checks the result with objdump -T.
//
// Sanitizer builds (test/sanitizers, -fsanitize=address) keep the wraps (binding.gyp has
// one configuration) but forward to __real_SYMBOL, the default version, so ASan's
// interceptors see the calls as before.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <stdarg.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#if (defined(__x86_64__) || defined(__aarch64__)) && defined(__linux__)

// The oldest version of each symbol, and _STAT_VER of the pre-2.33 __xstat64 & co.
#if defined(__x86_64__)
#define MOORING_GLIBC_BASE "GLIBC_2.2.5"
#define MOORING_STAT_VER 1
#else
#define MOORING_GLIBC_BASE "GLIBC_2.17"
#define MOORING_STAT_VER 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define MOORING_COMPAT_OLD(name) __real_##name
#else
#define MOORING_COMPAT_OLD(name) mooring_old_##name
#endif

extern "C" {

// libstdc++.a (GCC 12) reads this GLIBC_2.32 data symbol to skip atomics when the
// process has one thread. Our own hidden definition, always 0, binds libstdc++.a's
// references inside the addon: always use atomics (Node is multi-threaded anyway).
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;

#define MOORING_DECLARE(ret, name, params)                 \
  ret __real_##name params;                                \
  ret mooring_old_##name params;                           \
  ret __wrap_##name params;

MOORING_DECLARE(int, pthread_rwlock_init, (pthread_rwlock_t*, const pthread_rwlockattr_t*))
MOORING_DECLARE(int, pthread_rwlock_destroy, (pthread_rwlock_t*))
MOORING_DECLARE(int, pthread_rwlock_rdlock, (pthread_rwlock_t*))
MOORING_DECLARE(int, pthread_rwlock_wrlock, (pthread_rwlock_t*))
MOORING_DECLARE(int, pthread_rwlock_tryrdlock, (pthread_rwlock_t*))
MOORING_DECLARE(int, pthread_rwlock_trywrlock, (pthread_rwlock_t*))
MOORING_DECLARE(int, pthread_rwlock_unlock, (pthread_rwlock_t*))
MOORING_DECLARE(int, pthread_rwlockattr_init, (pthread_rwlockattr_t*))
MOORING_DECLARE(int, pthread_rwlockattr_destroy, (pthread_rwlockattr_t*))
MOORING_DECLARE(int, pthread_rwlockattr_setkind_np, (pthread_rwlockattr_t*, int))
MOORING_DECLARE(int, pthread_once, (pthread_once_t*, void (*)(void)))
MOORING_DECLARE(void*, dlopen, (const char*, int))
MOORING_DECLARE(void*, dlsym, (void*, const char*))
MOORING_DECLARE(char*, dlerror, (void))
MOORING_DECLARE(int, dlclose, (void*))
MOORING_DECLARE(int, stat64, (const char*, struct stat64*))
MOORING_DECLARE(int, lstat64, (const char*, struct stat64*))
MOORING_DECLARE(int, fstat64, (int, struct stat64*))
MOORING_DECLARE(int, pthread_cond_clockwait, (pthread_cond_t*, pthread_mutex_t*, clockid_t, const struct timespec*))

MOORING_DECLARE(int, pthread_create, (pthread_t*, const pthread_attr_t*, void* (*)(void*), void*))
MOORING_DECLARE(int, pthread_join, (pthread_t, void**))
MOORING_DECLARE(int, pthread_detach, (pthread_t))
MOORING_DECLARE(int, pthread_key_create, (pthread_key_t*, void (*)(void*)))
MOORING_DECLARE(int, __pthread_key_create, (pthread_key_t*, void (*)(void*)))
MOORING_DECLARE(int, pthread_key_delete, (pthread_key_t))
MOORING_DECLARE(void*, pthread_getspecific, (pthread_key_t))
MOORING_DECLARE(int, pthread_setspecific, (pthread_key_t, const void*))
MOORING_DECLARE(uint32_t, arc4random, (void))
MOORING_DECLARE(int, getentropy, (void*, size_t))
int __real_fcntl64(int, int, ...);
int mooring_old_fcntl(int, int, ...);
int __wrap_fcntl64(int, int, ...);
MOORING_DECLARE(int, _dl_find_object, (void*, struct dl_find_object*))

int mooring_old___xstat64(int, const char*, struct stat64*);
int mooring_old___lxstat64(int, const char*, struct stat64*);
int mooring_old___fxstat64(int, int, struct stat64*);

__asm__(".symver mooring_old_pthread_rwlock_init, pthread_rwlock_init@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlock_destroy, pthread_rwlock_destroy@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlock_rdlock, pthread_rwlock_rdlock@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlock_wrlock, pthread_rwlock_wrlock@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlock_tryrdlock, pthread_rwlock_tryrdlock@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlock_trywrlock, pthread_rwlock_trywrlock@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlock_unlock, pthread_rwlock_unlock@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlockattr_init, pthread_rwlockattr_init@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlockattr_destroy, pthread_rwlockattr_destroy@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_rwlockattr_setkind_np, pthread_rwlockattr_setkind_np@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_once, pthread_once@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_create, pthread_create@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_join, pthread_join@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_detach, pthread_detach@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_key_create, pthread_key_create@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old___pthread_key_create, __pthread_key_create@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_key_delete, pthread_key_delete@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_getspecific, pthread_getspecific@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_pthread_setspecific, pthread_setspecific@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_fcntl, fcntl@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_dlopen, dlopen@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_dlsym, dlsym@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_dlerror, dlerror@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old_dlclose, dlclose@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old___xstat64, __xstat64@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old___lxstat64, __lxstat64@" MOORING_GLIBC_BASE);
__asm__(".symver mooring_old___fxstat64, __fxstat64@" MOORING_GLIBC_BASE);

#define MOORING_FORWARD(ret, name, params, args) \
  ret __wrap_##name params { return MOORING_COMPAT_OLD(name) args; }

MOORING_FORWARD(int, pthread_rwlock_init, (pthread_rwlock_t* l, const pthread_rwlockattr_t* a), (l, a))
MOORING_FORWARD(int, pthread_rwlock_destroy, (pthread_rwlock_t* l), (l))
MOORING_FORWARD(int, pthread_rwlock_rdlock, (pthread_rwlock_t* l), (l))
MOORING_FORWARD(int, pthread_rwlock_wrlock, (pthread_rwlock_t* l), (l))
MOORING_FORWARD(int, pthread_rwlock_tryrdlock, (pthread_rwlock_t* l), (l))
MOORING_FORWARD(int, pthread_rwlock_trywrlock, (pthread_rwlock_t* l), (l))
MOORING_FORWARD(int, pthread_rwlock_unlock, (pthread_rwlock_t* l), (l))
MOORING_FORWARD(int, pthread_rwlockattr_init, (pthread_rwlockattr_t* a), (a))
MOORING_FORWARD(int, pthread_rwlockattr_destroy, (pthread_rwlockattr_t* a), (a))
MOORING_FORWARD(int, pthread_rwlockattr_setkind_np, (pthread_rwlockattr_t* a, int k), (a, k))
MOORING_FORWARD(int, pthread_once, (pthread_once_t* o, void (*f)(void)), (o, f))
MOORING_FORWARD(int, pthread_create, (pthread_t* t, const pthread_attr_t* a, void* (*f)(void*), void* x), (t, a, f, x))
MOORING_FORWARD(int, pthread_join, (pthread_t t, void** r), (t, r))
MOORING_FORWARD(int, pthread_detach, (pthread_t t), (t))
MOORING_FORWARD(int, pthread_key_create, (pthread_key_t* k, void (*d)(void*)), (k, d))
MOORING_FORWARD(int, __pthread_key_create, (pthread_key_t* k, void (*d)(void*)), (k, d))
MOORING_FORWARD(int, pthread_key_delete, (pthread_key_t k), (k))
MOORING_FORWARD(void*, pthread_getspecific, (pthread_key_t k), (k))
MOORING_FORWARD(int, pthread_setspecific, (pthread_key_t k, const void* v), (k, v))
MOORING_FORWARD(void*, dlopen, (const char* f, int m), (f, m))
MOORING_FORWARD(void*, dlsym, (void* h, const char* s), (h, s))
MOORING_FORWARD(char*, dlerror, (void), ())
MOORING_FORWARD(int, dlclose, (void* h), (h))

#if defined(__SANITIZE_ADDRESS__)
MOORING_FORWARD(int, stat64, (const char* p, struct stat64* b), (p, b))
MOORING_FORWARD(int, lstat64, (const char* p, struct stat64* b), (p, b))
MOORING_FORWARD(int, fstat64, (int fd, struct stat64* b), (fd, b))
MOORING_FORWARD(int, pthread_cond_clockwait,
                (pthread_cond_t* c, pthread_mutex_t* m, clockid_t k, const struct timespec* t), (c, m, k, t))
MOORING_FORWARD(uint32_t, arc4random, (void), ())
#if defined(__aarch64__)  // wrapped on aarch64 only (binding.gyp)
MOORING_FORWARD(int, getentropy, (void* b, size_t n), (b, n))
int __wrap_fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return __real_fcntl64(fd, cmd, arg);
}
#endif
MOORING_FORWARD(int, _dl_find_object, (void* pc, struct dl_find_object* r), (pc, r))
#else
// arc4random (glibc 2.36) and getentropy (2.25), std::random_device's sources in
// libstdc++.a, from the getrandom system call (Linux 3.17; glibc's wrapper is 2.25), which
// blocks only until the kernel's pool is first seeded.
static void mooring_random_bytes(void* buf, size_t len) {
  unsigned char* p = static_cast<unsigned char*>(buf);
  size_t got = 0;
  while (got < len) {
    long n = syscall(SYS_getrandom, p + got, len - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else if (n < 0 && errno != EINTR) __builtin_trap();
  }
}
uint32_t __wrap_arc4random(void) {
  uint32_t v = 0;
  mooring_random_bytes(&v, sizeof v);
  return v;
}
#if defined(__aarch64__)  // wrapped on aarch64 only (binding.gyp): x86_64's floor has both
int __wrap_getentropy(void* buf, size_t len) {
  if (len > 256) {
    errno = EIO;
    return -1;
  }
  mooring_random_bytes(buf, len);
  return 0;
}

// fcntl64 (2.28) is fcntl on 64-bit targets; its one optional argument is an int or a
// pointer, passed on as a pointer-sized value.
int __wrap_fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return mooring_old_fcntl(fd, cmd, arg);
}
#endif

// _dl_find_object (glibc 2.35) is how libgcc_eh.a's unwinder finds a PC's .eh_frame_hdr
// for exceptions. Same answer from dl_iterate_phdr (every glibc): the loaded object whose
// PT_LOAD segment holds the PC, its mapping bounds, and its PT_GNU_EH_FRAME address.
// dlfo_link_map is left null (libgcc does not read it on x86_64).
namespace {
struct FindObject {
  uintptr_t pc;
  struct dl_find_object* result;
  bool found;
};
int find_object_cb(struct dl_phdr_info* info, size_t, void* data) {
  FindObject* f = static_cast<FindObject*>(data);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  bool holds = false;
  const void* eh = nullptr;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) {
      uintptr_t start = info->dlpi_addr + ph.p_vaddr;
      uintptr_t end = start + ph.p_memsz;
      if (start < lo) lo = start;
      if (end > hi) hi = end;
      if (f->pc >= start && f->pc < end) holds = true;
    } else if (ph.p_type == PT_GNU_EH_FRAME) {
      eh = reinterpret_cast<const void*>(info->dlpi_addr + ph.p_vaddr);
    }
  }
  if (!holds) return 0;
  f->result->dlfo_flags = 0;
  f->result->dlfo_map_start = reinterpret_cast<void*>(lo);
  f->result->dlfo_map_end = reinterpret_cast<void*>(hi);
  f->result->dlfo_link_map = nullptr;
  f->result->dlfo_eh_frame = const_cast<void*>(eh);
  f->found = true;
  return 1;
}
}  // namespace

int __wrap__dl_find_object(void* pc, struct dl_find_object* result) {
  FindObject f{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(find_object_cb, &f);
  return f.found ? 0 : -1;
}

// Before glibc 2.33, stat64 & co. were inline wrappers around __xstat64 & co. with
// _STAT_VER (1 on x86_64, 0 on aarch64).
int __wrap_stat64(const char* p, struct stat64* b) { return mooring_old___xstat64(MOORING_STAT_VER, p, b); }
int __wrap_lstat64(const char* p, struct stat64* b) { return mooring_old___lxstat64(MOORING_STAT_VER, p, b); }
int __wrap_fstat64(int fd, struct stat64* b) { return mooring_old___fxstat64(MOORING_STAT_VER, fd, b); }

// pthread_cond_clockwait exists only from glibc 2.30: libstdc++ calls it for
// std::condition_variable waits on steady_clock (CLOCK_MONOTONIC) and system_clock
// (CLOCK_REALTIME) deadlines. Where the running glibc has it (looked up once, by name, so
// no version is required at load), it is called: monotonic waits stay immune to wall-clock
// steps. Before 2.30 it is emulated. Assumption: the condvar uses the default clock,
// CLOCK_REALTIME (std::condition_variable never sets a condattr clock; nor does our code).
// A CLOCK_REALTIME deadline is passed on as is; any other clock's deadline is turned into
// "now on CLOCK_REALTIME + time left on that clock". A wall-clock step during such a wait
// makes it return early or late; callers (libstdc++'s wait_until loop, our predicates)
// re-check their own clock and wait again, as for a spurious wakeup.
typedef int (*mooring_clockwait_fn)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const struct timespec*);
static mooring_clockwait_fn mooring_running_clockwait() {
  static const mooring_clockwait_fn fn =
      reinterpret_cast<mooring_clockwait_fn>(mooring_old_dlsym(RTLD_DEFAULT, "pthread_cond_clockwait"));
  return fn;
}

int __wrap_pthread_cond_clockwait(pthread_cond_t* c, pthread_mutex_t* m, clockid_t clock,
                                  const struct timespec* abstime) {
  if (mooring_clockwait_fn fn = mooring_running_clockwait()) return fn(c, m, clock, abstime);
  if (clock == CLOCK_REALTIME) return pthread_cond_timedwait(c, m, abstime);
  struct timespec now_clock, now_real;
  clock_gettime(clock, &now_clock);
  clock_gettime(CLOCK_REALTIME, &now_real);
  long long left_ns = (static_cast<long long>(abstime->tv_sec) - now_clock.tv_sec) * 1000000000LL +
                      (abstime->tv_nsec - now_clock.tv_nsec);
  if (left_ns < 0) left_ns = 0;
  long long real_ns = static_cast<long long>(now_real.tv_nsec) + left_ns % 1000000000LL;
  struct timespec deadline;
  deadline.tv_sec = now_real.tv_sec + static_cast<time_t>(left_ns / 1000000000LL) + static_cast<time_t>(real_ns / 1000000000LL);
  deadline.tv_nsec = static_cast<long>(real_ns % 1000000000LL);
  return pthread_cond_timedwait(c, m, &deadline);
}
#endif

}  // extern "C"

#endif
