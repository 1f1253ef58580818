/*
 * glibc_compat.h: binds the glibc functions that libfairgo.so calls to
 * their glibc 2.28 (or older) symbol versions, so that a library built on a
 * newer glibc loads on glibc 2.28 (RHEL/Rocky/Alma 8, Debian 10, Ubuntu
 * 20.04 and newer) and its wheel can be tagged manylinux_2_28.
 *
 * Not included by any source file: `make libfairgo` force-includes it into
 * every C file of the build, runtime/cgo's and package net's among them,
 * through CGO_CFLAGS (-include), and links libpthread.so.0, libdl.so.2 and
 * libresolv.so.2 without --as-needed: on glibc before 2.34 the old
 * versions bound here live in those libraries, not in libc.so.6.
 *
 * glibc 2.32 and 2.34 moved the pthread, dl and resolver functions into
 * libc.so.6 under new default versions (pthread_create@@GLIBC_2.34, ...)
 * and kept the old versions there as compatibility symbols of the same
 * functions, so the binding changes no behaviour. An .symver of a function
 * a file does not call emits nothing.
 *
 * C only: CGO_CFLAGS reach runtime/cgo's assembly files too, where it does
 * nothing. x86_64 only (its base version is GLIBC_2.2.5): elsewhere, and
 * without glibc (no <gnu/libc-version.h>), it does nothing and the wheel's
 * tag follows what the library needs (python/build_wheel.py). It includes
 * no header itself: a file's own feature macros (_GNU_SOURCE) must come
 * before the first system header.
 *
 * python/tests/test_wheel.py fails when the library needs a version newer
 * than GLIBC_2.28; a function that appears there gets a line below (when
 * glibc has an old version of it: `objdump -T /lib/x86_64-linux-gnu/libc.so.6
 * | grep -w NAME`) or has to go.
 */
#ifndef FAIRGO_GLIBC_COMPAT_H
#define FAIRGO_GLIBC_COMPAT_H

#if defined(__linux__) && defined(__x86_64__) && defined(__has_include) && !defined(__ASSEMBLER__)
#if __has_include(<gnu/libc-version.h>)

#define FG_SYMVER(sym, old, ver) __asm__(".symver " #sym "," #old "@" #ver);

/* pthread: libpthread.so.0 before 2.34 (pthread_sigmask and
 * pthread_getattr_np moved in 2.32). runtime/cgo calls pthread_create,
 * pthread_attr_*, pthread_sigmask, pthread_getattr_np, pthread_key_create,
 * pthread_getspecific, pthread_setspecific and pthread_once. */
FG_SYMVER(pthread_create, pthread_create, GLIBC_2.2.5)
FG_SYMVER(pthread_detach, pthread_detach, GLIBC_2.2.5)
FG_SYMVER(pthread_join, pthread_join, GLIBC_2.2.5)
FG_SYMVER(pthread_tryjoin_np, pthread_tryjoin_np, GLIBC_2.3.3)
FG_SYMVER(pthread_timedjoin_np, pthread_timedjoin_np, GLIBC_2.3.3)
FG_SYMVER(pthread_kill, pthread_kill, GLIBC_2.2.5)
FG_SYMVER(pthread_cancel, pthread_cancel, GLIBC_2.2.5)
FG_SYMVER(pthread_testcancel, pthread_testcancel, GLIBC_2.2.5)
FG_SYMVER(pthread_sigmask, pthread_sigmask, GLIBC_2.2.5)
FG_SYMVER(pthread_getattr_np, pthread_getattr_np, GLIBC_2.2.5)
FG_SYMVER(pthread_getattr_default_np, pthread_getattr_default_np, GLIBC_2.18)
FG_SYMVER(pthread_setattr_default_np, pthread_setattr_default_np, GLIBC_2.18)
FG_SYMVER(pthread_attr_getstack, pthread_attr_getstack, GLIBC_2.2.5)
FG_SYMVER(pthread_attr_setstack, pthread_attr_setstack, GLIBC_2.2.5)
FG_SYMVER(pthread_attr_getstacksize, pthread_attr_getstacksize, GLIBC_2.2.5)
FG_SYMVER(pthread_attr_setstacksize, pthread_attr_setstacksize, GLIBC_2.2.5)
FG_SYMVER(pthread_attr_getguardsize, pthread_attr_getguardsize, GLIBC_2.2.5)
FG_SYMVER(pthread_attr_setguardsize, pthread_attr_setguardsize, GLIBC_2.2.5)
FG_SYMVER(pthread_attr_getaffinity_np, pthread_attr_getaffinity_np, GLIBC_2.3.4)
FG_SYMVER(pthread_attr_setaffinity_np, pthread_attr_setaffinity_np, GLIBC_2.3.4)
FG_SYMVER(pthread_getaffinity_np, pthread_getaffinity_np, GLIBC_2.3.4)
FG_SYMVER(pthread_setaffinity_np, pthread_setaffinity_np, GLIBC_2.3.4)
FG_SYMVER(pthread_getname_np, pthread_getname_np, GLIBC_2.12)
FG_SYMVER(pthread_setname_np, pthread_setname_np, GLIBC_2.12)
FG_SYMVER(pthread_getcpuclockid, pthread_getcpuclockid, GLIBC_2.2.5)
FG_SYMVER(pthread_key_create, pthread_key_create, GLIBC_2.2.5)
FG_SYMVER(pthread_key_delete, pthread_key_delete, GLIBC_2.2.5)
FG_SYMVER(pthread_getspecific, pthread_getspecific, GLIBC_2.2.5)
FG_SYMVER(pthread_setspecific, pthread_setspecific, GLIBC_2.2.5)
FG_SYMVER(pthread_once, pthread_once, GLIBC_2.2.5)
FG_SYMVER(pthread_mutex_trylock, pthread_mutex_trylock, GLIBC_2.2.5)
FG_SYMVER(pthread_mutex_timedlock, pthread_mutex_timedlock, GLIBC_2.2.5)
FG_SYMVER(pthread_mutexattr_init, pthread_mutexattr_init, GLIBC_2.2.5)
FG_SYMVER(pthread_mutexattr_destroy, pthread_mutexattr_destroy, GLIBC_2.2.5)
FG_SYMVER(pthread_mutexattr_settype, pthread_mutexattr_settype, GLIBC_2.2.5)
FG_SYMVER(pthread_mutexattr_gettype, pthread_mutexattr_gettype, GLIBC_2.2.5)
FG_SYMVER(pthread_mutexattr_setpshared, pthread_mutexattr_setpshared, GLIBC_2.2.5)
FG_SYMVER(pthread_mutexattr_getpshared, pthread_mutexattr_getpshared, GLIBC_2.2.5)
FG_SYMVER(pthread_condattr_setclock, pthread_condattr_setclock, GLIBC_2.3.3)
FG_SYMVER(pthread_condattr_getclock, pthread_condattr_getclock, GLIBC_2.3.3)
FG_SYMVER(pthread_condattr_setpshared, pthread_condattr_setpshared, GLIBC_2.2.5)
FG_SYMVER(pthread_condattr_getpshared, pthread_condattr_getpshared, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_init, pthread_rwlock_init, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_destroy, pthread_rwlock_destroy, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_rdlock, pthread_rwlock_rdlock, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_wrlock, pthread_rwlock_wrlock, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_tryrdlock, pthread_rwlock_tryrdlock, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_trywrlock, pthread_rwlock_trywrlock, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_timedrdlock, pthread_rwlock_timedrdlock, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_timedwrlock, pthread_rwlock_timedwrlock, GLIBC_2.2.5)
FG_SYMVER(pthread_rwlock_unlock, pthread_rwlock_unlock, GLIBC_2.2.5)
FG_SYMVER(pthread_spin_init, pthread_spin_init, GLIBC_2.2.5)
FG_SYMVER(pthread_spin_destroy, pthread_spin_destroy, GLIBC_2.2.5)
FG_SYMVER(pthread_spin_lock, pthread_spin_lock, GLIBC_2.2.5)
FG_SYMVER(pthread_spin_trylock, pthread_spin_trylock, GLIBC_2.2.5)
FG_SYMVER(pthread_spin_unlock, pthread_spin_unlock, GLIBC_2.2.5)
FG_SYMVER(pthread_barrier_init, pthread_barrier_init, GLIBC_2.2.5)
FG_SYMVER(pthread_barrier_destroy, pthread_barrier_destroy, GLIBC_2.2.5)
FG_SYMVER(pthread_barrier_wait, pthread_barrier_wait, GLIBC_2.2.5)
FG_SYMVER(sem_init, sem_init, GLIBC_2.2.5)
FG_SYMVER(sem_destroy, sem_destroy, GLIBC_2.2.5)
FG_SYMVER(sem_wait, sem_wait, GLIBC_2.2.5)
FG_SYMVER(sem_trywait, sem_trywait, GLIBC_2.2.5)
FG_SYMVER(sem_timedwait, sem_timedwait, GLIBC_2.2.5)
FG_SYMVER(sem_post, sem_post, GLIBC_2.2.5)
FG_SYMVER(sem_getvalue, sem_getvalue, GLIBC_2.2.5)

/* dl: libdl.so.2 before 2.34. The loaders of the CUDA driver and NCCL
 * (internal/dl) and runtime/cgo call them. */
FG_SYMVER(dlopen, dlopen, GLIBC_2.2.5)
FG_SYMVER(dlsym, dlsym, GLIBC_2.2.5)
FG_SYMVER(dlvsym, dlvsym, GLIBC_2.2.5)
FG_SYMVER(dlclose, dlclose, GLIBC_2.2.5)
FG_SYMVER(dlerror, dlerror, GLIBC_2.2.5)
FG_SYMVER(dladdr, dladdr, GLIBC_2.2.5)
FG_SYMVER(dladdr1, dladdr1, GLIBC_2.3.3)
FG_SYMVER(dlinfo, dlinfo, GLIBC_2.3.3)

/* The resolver: libresolv.so.2 before 2.34, where <resolv.h> named
 * res_search __res_search. Package net's cgo resolver calls res_search. */
FG_SYMVER(res_search, __res_search, GLIBC_2.2.5)
FG_SYMVER(res_nsearch, __res_nsearch, GLIBC_2.2.5)
FG_SYMVER(res_query, __res_query, GLIBC_2.2.5)
FG_SYMVER(res_nquery, __res_nquery, GLIBC_2.2.5)
FG_SYMVER(dn_expand, __dn_expand, GLIBC_2.2.5)

#undef FG_SYMVER

#endif
#endif

#endif
