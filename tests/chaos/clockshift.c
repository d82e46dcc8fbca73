/* A wall-clock step for one process, without touching its monotonic clocks.
 *
 * LD_PRELOAD this library and set CLOCKSHIFT_FILE to a file holding a signed offset in
 * milliseconds ("3600000", "-30000"). clock_gettime(CLOCK_REALTIME*), gettimeofday and time
 * return the real wall clock plus that offset; the file is re-read at most every 5 ms of
 * monotonic time. Everything else (CLOCK_MONOTONIC, CLOCK_BOOTTIME, sleeps) is the kernel's.
 *
 * Why not libfaketime: it cannot run redis-server (jemalloc recurses into its start-up), and
 * with FAKETIME_DONT_FAKE_MONOTONIC=1 Python's time.sleep() fails with EINVAL. This file uses
 * raw syscalls only: no malloc, no dlsym, no stdio, so it is safe in any process.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile long long offset_ns;
static volatile long long next_read_ns;

static long long now_ns(clockid_t clock) {
    struct timespec ts;
    syscall(SYS_clock_gettime, clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long current_offset(void) {
    long long mono = now_ns(CLOCK_MONOTONIC);
    if (mono < next_read_ns) return offset_ns;
    next_read_ns = mono + 5000000LL;
    extern char **environ;
    const char *path = 0;
    for (char **env = environ; env && *env; env++) {
        const char *e = *env, *k = "CLOCKSHIFT_FILE=";
        while (*k && *e == *k) { e++; k++; }
        if (!*k) { path = e; break; }
    }
    if (!path) return offset_ns;
    int fd = (int)syscall(SYS_open, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return offset_ns;
    char buf[32];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return offset_ns;
    buf[n] = 0;
    int i = 0, negative = 0, digits = 0;
    long long ms = 0;
    while (buf[i] == ' ') i++;
    if (buf[i] == '-' || buf[i] == '+') negative = buf[i++] == '-';
    for (; buf[i] >= '0' && buf[i] <= '9'; i++, digits++) ms = ms * 10 + (buf[i] - '0');
    if (digits) offset_ns = (negative ? -ms : ms) * 1000000LL;
    return offset_ns;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long rc = syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long t = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + current_offset();
        ts->tv_sec = t / 1000000000LL;
        ts->tv_nsec = t % 1000000000LL;
    }
    return (int)rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    long rc = syscall(SYS_gettimeofday, tv, tz);
    if (rc == 0 && tv) {
        long long t = (long long)tv->tv_sec * 1000000LL + tv->tv_usec + current_offset() / 1000;
        tv->tv_sec = t / 1000000LL;
        tv->tv_usec = t % 1000000LL;
    }
    return (int)rc;
}

time_t time(time_t *out) {
    time_t t = (time_t)((now_ns(CLOCK_REALTIME) + current_offset()) / 1000000000LL);
    if (out) *out = t;
    return t;
}
