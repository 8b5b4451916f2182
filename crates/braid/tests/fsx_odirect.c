/*
 * LD_PRELOAD shim for crates/braid/tests/posix_suites.rs: fsx (fsx-rs) has no O_DIRECT
 * option, so this adds O_DIRECT to every open of the one path named by
 * $FSX_ODIRECT_PATH (fsx's test file, at its start and at every close/reopen), and to
 * nothing else (not fsx's .fsxgood/.fsxlog artifacts). It says so on stderr once, so the
 * test can tell a run really was O_DIRECT.
 *
 * Built by the test with: cc -shared -fPIC -o fsx_odirect.so fsx_odirect.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

static int direct_flags(const char *path, int flags) {
    static int told;
    const char *want = getenv("FSX_ODIRECT_PATH");
    if (want == NULL || path == NULL || strcmp(path, want) != 0)
        return flags;
    if (!told) {
        told = 1;
        fprintf(stderr, "fsx_odirect: opening %s with O_DIRECT\n", path);
    }
    return flags | O_DIRECT;
}

static int needs_mode(int flags) {
    return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
}

#define MODE_ARG(flags)                                                                    \
    mode_t mode = 0;                                                                       \
    if (needs_mode(flags)) {                                                               \
        va_list ap;                                                                        \
        va_start(ap, flags);                                                               \
        mode = va_arg(ap, mode_t);                                                         \
        va_end(ap);                                                                        \
    }

int open(const char *path, int flags, ...) {
    static int (*real)(const char *, int, ...);
    MODE_ARG(flags);
    if (real == NULL)
        real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    return real(path, direct_flags(path, flags), mode);
}

int open64(const char *path, int flags, ...) {
    static int (*real)(const char *, int, ...);
    MODE_ARG(flags);
    if (real == NULL)
        real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open64");
    return real(path, direct_flags(path, flags), mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    static int (*real)(int, const char *, int, ...);
    MODE_ARG(flags);
    if (real == NULL)
        real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    return real(dirfd, path, direct_flags(path, flags), mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    static int (*real)(int, const char *, int, ...);
    MODE_ARG(flags);
    if (real == NULL)
        real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat64");
    return real(dirfd, path, direct_flags(path, flags), mode);
}
