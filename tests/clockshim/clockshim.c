/* A wall-clock shim for the tests: LD_PRELOAD it and set CLOCKSHIM_OFFSET_S (seconds, may be
 * negative or fractional) to move CLOCK_REALTIME, gettimeofday() and time() of the process and its
 * children by that much. Every other clock (CLOCK_MONOTONIC, CLOCK_BOOTTIME) is left alone, and so
 * are sleeps and timed waits: libfaketime 0.9.10 breaks Python 3.11's time.sleep and Event.wait. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long offset_ns(void) {
    static int loaded;
    static long long value;
    if (!loaded) {
        const char *text = getenv("CLOCKSHIM_OFFSET_S");
        value = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
        loaded = 1;
    }
    return value;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) {
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    }
    int rc = real(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
        ts->tv_sec = (time_t)(ns / 1000000000LL);
        ts->tv_nsec = (long)(ns % 1000000000LL);
        if (ts->tv_nsec < 0) {
            ts->tv_nsec += 1000000000L;
            ts->tv_sec -= 1;
        }
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
