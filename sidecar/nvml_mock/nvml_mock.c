/*
 * A mock libnvidia-ml.so.1 for tests, demos and the kind image: it exports the NVML symbols the
 * sidecar reaches through pynvml, with the real signatures, struct layouts and versioned-struct
 * checks, and answers from a scenario file instead of a driver.
 *
 * The scenario is a flat "key=value" file compiled from JSON by sidecar/nvml_mock/scenario.py
 * (see docs/nvml-mock.md). It is read at every first nvmlInit (refcount 0 -> 1) from
 * soak_nvml_mock_set_scenario() if called, else from $SOAK_NVML_MOCK_SCENARIO; without either,
 * nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED like a host that has the library but no driver.
 *
 * Build: gcc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 nvml_mock.c -lpthread
 * The soname lets an in-process preload by absolute path satisfy pynvml's dlopen("libnvidia-ml.so.1").
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_RESET_REQUIRED 16
#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu
#define MIB 1048576.0

/* Versioned structs: version = sizeof(struct) | (struct version << 24), as in nvml.h. */
#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* the v2 and v3 layouts are identical */

#define MAX_DEVICES 64
#define MAX_POINTS 64
#define MAX_PROCS 64
#define SPEC_LEN 512

/* One function (or one clock domain) that can be made to fail from the scenario. */
enum {
    F_MEMORY,
    F_MEMORY_V2,
    F_UTILIZATION,
    F_TEMPERATURE,
    F_TEMPERATURE_V,
    F_POWER,
    F_CLOCK_GRAPHICS,
    F_CLOCK_SM,
    F_CLOCK_MEM,
    F_ECC,
    F_RETIRED_PAGES,
    F_COMPUTE_PROCESSES,
    F_GRAPHICS_PROCESSES,
    F_NAME,
    F_UUID,
    F_EVENTS,
    F_REMAPPED_ROWS,
    F_RETIRED_PAGES_PENDING,
    F_CLOCK_EVENT_REASONS,
    F_CLOCK_THROTTLE_REASONS,
    F_PCIE_REPLAY,
    F_NVLINK,
    F_FIELD_VALUES,
    F_COUNT
};

static const char *const function_keys[F_COUNT] = {
    "memory", "memory_v2", "utilization", "temperature", "temperature_v", "power", "clock_graphics",
    "clock_sm", "clock_mem", "ecc", "retired_pages", "compute_processes", "graphics_processes", "name",
    "uuid", "events", "remapped_rows", "retired_pages_pending", "clock_event_reasons",
    "clock_throttle_reasons", "pcie_replay", "nvlink", "field_values",
};

#define MAX_EVENTS 64
#define MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS */
/* nvmlEventType*: the kinds a scenario can emit, all that nvmlDeviceGetSupportedEventTypes reports. */
#define EVENT_SINGLE_BIT_ECC 0x1ULL
#define EVENT_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_XID_CRITICAL 0x8ULL
#define SUPPORTED_EVENTS (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL)

typedef struct {
    double at;
    unsigned long long type;
    unsigned long long data;
} mock_event;

typedef struct {
    int active;
    unsigned long long counters[4]; /* NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT, _CRC_DATA */
} mock_link;

typedef struct {
    int count;
    double t[MAX_POINTS];
    double v[MAX_POINTS];
} series;

typedef struct {
    int code; /* 0: none */
    double from;
    double until; /* < 0: forever */
} injected_error;

typedef struct {
    char pid_spec[SPEC_LEN]; /* "123", "$ENV_NAME", "@/path/to/pidfile" or "~cmdline text" */
    series used_mib;
    int graphics;
} mock_process;

typedef struct mock_device {
    char uuid[96];
    char name[96];
    double total_mib;
    double reserved_mib;
    series used_mib;
    unsigned int util_gpu, util_mem, temperature_c, power_mw;
    unsigned int clock_graphics, clock_sm, clock_mem;
    series ecc_uncorrected; /* errors counted so far: a soak's new ones are a GPU fault */
    series ecc_corrected;   /* single-bit errors the hardware corrected, counted so far */
    unsigned int retired_sbe, retired_dbe;
    injected_error errors[F_COUNT];
    double lost_at, reset_at; /* < 0: never */
    int process_count;
    mock_process processes[MAX_PROCS];
    unsigned long samples; /* memory queries so far: the "samples" time unit */
    int event_count;
    mock_event events[MAX_EVENTS]; /* sorted by time */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    int recovery_action; /* NVML_GPU_RECOVERY_ACTION_*, -1: the driver reports none */
    unsigned int retired_pending;
    series clock_reasons; /* a step function: the mask of the last point at or before t */
    series pcie_replay;
    int link_count;
    mock_link links[MAX_LINKS];
} mock_device;

typedef mock_device *nvmlDevice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static char scenario_override[4096];
static char loaded_path[4096];
static char driver_version[80] = "535.129.03";
static int time_in_samples;
/* Set once one of our own descendants matched: we are a local sidecar, and a match elsewhere is
 * another run's process (parallel tests, a second local soak), never ours, even once ours is gone. */
static int descendants_only;
static int device_count;
static mock_device devices[MAX_DEVICES];
static struct timespec init_time;
static int no_event_api; /* a driver older than the event API: every event call is FUNCTION_NOT_FOUND */

/* Exported so the sidecar can tell this mock from a real driver library. */
int soak_nvml_mock_version(void) { return 1; }

/* Names the scenario for the next first nvmlInit; NULL or "" falls back to the environment. */
void soak_nvml_mock_set_scenario(const char *path) {
    pthread_mutex_lock(&lock);
    if (path == NULL) {
        scenario_override[0] = '\0';
    } else {
        snprintf(scenario_override, sizeof scenario_override, "%s", path);
    }
    pthread_mutex_unlock(&lock);
}

static double elapsed_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - init_time.tv_sec) + (double)(now.tv_nsec - init_time.tv_nsec) / 1e9;
}

static double device_time(const mock_device *dev) {
    return time_in_samples ? (double)dev->samples : elapsed_s();
}

static double series_at(const series *s, double t) {
    if (s->count == 0) {
        return 0.0;
    }
    if (t <= s->t[0]) {
        return s->v[0];
    }
    for (int i = 1; i < s->count; i++) {
        if (t <= s->t[i]) {
            double span = s->t[i] - s->t[i - 1];
            double frac = span > 0 ? (t - s->t[i - 1]) / span : 1.0;
            return s->v[i - 1] + frac * (s->v[i] - s->v[i - 1]);
        }
    }
    return s->v[s->count - 1];
}

/* The value of the last point at or before t: masks and counts step, they do not ramp. */
static unsigned long long step_at(const series *s, double t) {
    double value = 0;
    for (int i = 0; i < s->count && s->t[i] <= t; i++) {
        value = s->v[i];
    }
    return (unsigned long long)value;
}

/* "t:v,t:v,..." */
static int parse_series(const char *text, series *out) {
    out->count = 0;
    const char *p = text;
    while (*p != '\0') {
        if (out->count >= MAX_POINTS) {
            return -1;
        }
        char *end = NULL;
        double t = strtod(p, &end);
        if (end == p || *end != ':') {
            return -1;
        }
        p = end + 1;
        double v = strtod(p, &end);
        if (end == p) {
            return -1;
        }
        out->t[out->count] = t;
        out->v[out->count] = v;
        out->count++;
        p = end;
        if (*p == ',') {
            p++;
        } else if (*p != '\0') {
            return -1;
        }
    }
    return 0;
}

/* "code,from,until" */
static int parse_error(const char *text, injected_error *out) {
    return sscanf(text, "%d,%lf,%lf", &out->code, &out->from, &out->until) == 3 ? 0 : -1;
}

static int parse_uint(const char *text, unsigned int *out) {
    char *end = NULL;
    unsigned long v = strtoul(text, &end, 10);
    if (end == text || *end != '\0' || v > 0xFFFFFFFFUL) {
        return -1;
    }
    *out = (unsigned int)v;
    return 0;
}

static int parse_double(const char *text, double *out) {
    char *end = NULL;
    *out = strtod(text, &end);
    return (end == text || *end != '\0') ? -1 : 0;
}

static int apply_process_key(mock_device *dev, int pi, const char *key, const char *value) {
    if (pi < 0 || pi >= MAX_PROCS) {
        return -1;
    }
    if (pi >= dev->process_count) {
        dev->process_count = pi + 1;
    }
    mock_process *proc = &dev->processes[pi];
    if (strcmp(key, "pid") == 0) {
        snprintf(proc->pid_spec, sizeof proc->pid_spec, "%s", value);
        return 0;
    }
    if (strcmp(key, "used_mib") == 0) {
        return parse_series(value, &proc->used_mib);
    }
    if (strcmp(key, "kind") == 0) {
        proc->graphics = strcmp(value, "graphics") == 0;
        return (proc->graphics || strcmp(value, "compute") == 0) ? 0 : -1;
    }
    return -1;
}

/* "at,type,data" */
static int apply_event_key(mock_device *dev, int ei, const char *value) {
    if (ei < 0 || ei >= MAX_EVENTS) {
        return -1;
    }
    if (ei >= dev->event_count) {
        dev->event_count = ei + 1;
    }
    mock_event *event = &dev->events[ei];
    return sscanf(value, "%lf,%llu,%llu", &event->at, &event->type, &event->data) == 3 ? 0 : -1;
}

/* "active,replay,recovery,crc_flit,crc_data" */
static int apply_link_key(mock_device *dev, int li, const char *value) {
    if (li < 0 || li >= MAX_LINKS) {
        return -1;
    }
    if (li >= dev->link_count) {
        dev->link_count = li + 1;
    }
    mock_link *link = &dev->links[li];
    unsigned long long *c = link->counters;
    return sscanf(value, "%d,%llu,%llu,%llu,%llu", &link->active, &c[0], &c[1], &c[2], &c[3]) == 5 ? 0 : -1;
}

static int apply_device_key(mock_device *dev, const char *key, const char *value) {
    int pi = 0;
    int consumed = 0;
    if (sscanf(key, "p%d.%n", &pi, &consumed) == 1 && consumed > 0) {
        return apply_process_key(dev, pi, key + consumed, value);
    }
    if (sscanf(key, "event%d%n", &pi, &consumed) == 1 && key[consumed] == '\0') {
        return apply_event_key(dev, pi, value);
    }
    if (sscanf(key, "link%d%n", &pi, &consumed) == 1 && key[consumed] == '\0') {
        return apply_link_key(dev, pi, value);
    }
    if (strcmp(key, "remapped_rows") == 0) {
        return sscanf(value, "%u,%u,%u,%u", &dev->remap_corr, &dev->remap_unc, &dev->remap_pending,
                      &dev->remap_failure) == 4 ? 0 : -1;
    }
    if (strcmp(key, "retired_pending") == 0) return parse_uint(value, &dev->retired_pending);
    if (strcmp(key, "recovery_action") == 0) return sscanf(value, "%d", &dev->recovery_action) == 1 ? 0 : -1;
    if (strcmp(key, "clock_reasons") == 0) return parse_series(value, &dev->clock_reasons);
    if (strcmp(key, "pcie_replay") == 0) return parse_series(value, &dev->pcie_replay);
    if (strncmp(key, "err.", 4) == 0) {
        for (int f = 0; f < F_COUNT; f++) {
            if (strcmp(key + 4, function_keys[f]) == 0) {
                return parse_error(value, &dev->errors[f]);
            }
        }
        return -1;
    }
    if (strcmp(key, "uuid") == 0) {
        snprintf(dev->uuid, sizeof dev->uuid, "%s", value);
        return 0;
    }
    if (strcmp(key, "name") == 0) {
        snprintf(dev->name, sizeof dev->name, "%s", value);
        return 0;
    }
    if (strcmp(key, "total_mib") == 0) return parse_double(value, &dev->total_mib);
    if (strcmp(key, "reserved_mib") == 0) return parse_double(value, &dev->reserved_mib);
    if (strcmp(key, "used_mib") == 0) return parse_series(value, &dev->used_mib);
    if (strcmp(key, "util_gpu") == 0) return parse_uint(value, &dev->util_gpu);
    if (strcmp(key, "util_mem") == 0) return parse_uint(value, &dev->util_mem);
    if (strcmp(key, "temperature_c") == 0) return parse_uint(value, &dev->temperature_c);
    if (strcmp(key, "power_mw") == 0) return parse_uint(value, &dev->power_mw);
    if (strcmp(key, "clock_graphics") == 0) return parse_uint(value, &dev->clock_graphics);
    if (strcmp(key, "clock_sm") == 0) return parse_uint(value, &dev->clock_sm);
    if (strcmp(key, "clock_mem") == 0) return parse_uint(value, &dev->clock_mem);
    if (strcmp(key, "retired_sbe") == 0) return parse_uint(value, &dev->retired_sbe);
    if (strcmp(key, "retired_dbe") == 0) return parse_uint(value, &dev->retired_dbe);
    if (strcmp(key, "ecc_uncorrected") == 0) return parse_series(value, &dev->ecc_uncorrected);
    if (strcmp(key, "ecc_corrected") == 0) return parse_series(value, &dev->ecc_corrected);
    if (strcmp(key, "lost_at") == 0) return parse_double(value, &dev->lost_at);
    if (strcmp(key, "reset_at") == 0) return parse_double(value, &dev->reset_at);
    return -1;
}

static int apply_key(const char *key, const char *value, int *init_error) {
    int di = 0;
    int consumed = 0;
    if (sscanf(key, "d%d.%n", &di, &consumed) == 1 && consumed > 0) {
        if (di < 0 || di >= device_count) {
            return -1;
        }
        return apply_device_key(&devices[di], key + consumed, value);
    }
    if (strcmp(key, "format") == 0) return strcmp(value, "soak-nvml-mock/1") == 0 ? 0 : -1;
    if (strcmp(key, "driver_version") == 0) {
        snprintf(driver_version, sizeof driver_version, "%s", value);
        return 0;
    }
    if (strcmp(key, "time_unit") == 0) {
        time_in_samples = strcmp(value, "samples") == 0;
        return (time_in_samples || strcmp(value, "seconds") == 0) ? 0 : -1;
    }
    if (strcmp(key, "init_error") == 0) return sscanf(value, "%d", init_error) == 1 ? 0 : -1;
    if (strcmp(key, "no_event_api") == 0) return sscanf(value, "%d", &no_event_api) == 1 ? 0 : -1;
    if (strcmp(key, "device_count") == 0) {
        if (sscanf(value, "%d", &device_count) != 1 || device_count < 0 || device_count > MAX_DEVICES) {
            return -1;
        }
        for (int i = 0; i < device_count; i++) {
            devices[i].lost_at = -1;
            devices[i].reset_at = -1;
        }
        return 0;
    }
    return -1;
}

/* Called with the lock held. Returns NVML_SUCCESS or the init error to report. */
static nvmlReturn_t load_scenario(void) {
    const char *path = scenario_override[0] != '\0' ? scenario_override : getenv("SOAK_NVML_MOCK_SCENARIO");
    if (path == NULL || path[0] == '\0') {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        fprintf(stderr, "nvml-mock: cannot open scenario %s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    memset(devices, 0, sizeof devices);
    device_count = 0;
    time_in_samples = 0;
    descendants_only = 0;
    no_event_api = 0;
    snprintf(driver_version, sizeof driver_version, "%s", "535.129.03");
    int init_error = 0;
    char line[8192];
    int lineno = 0;
    nvmlReturn_t result = NVML_SUCCESS;
    while (fgets(line, sizeof line, file) != NULL) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#') {
            continue;
        }
        char *eq = strchr(line, '=');
        if (eq == NULL) {
            fprintf(stderr, "nvml-mock: %s:%d: expected key=value\n", path, lineno);
            result = NVML_ERROR_UNKNOWN;
            break;
        }
        *eq = '\0';
        if (apply_key(line, eq + 1, &init_error) != 0) {
            fprintf(stderr, "nvml-mock: %s:%d: bad entry %s\n", path, lineno, line);
            result = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    fclose(file);
    if (result != NVML_SUCCESS) {
        return result;
    }
    clock_gettime(CLOCK_MONOTONIC, &init_time);
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    return init_error != 0 ? init_error : NVML_SUCCESS;
}

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0) {
        ret = load_scenario();
    } else if (scenario_override[0] != '\0' && strcmp(scenario_override, loaded_path) != 0) {
        /* NVML state is per process: a second scenario cannot apply while the first is in use. */
        fprintf(stderr, "nvml-mock: scenario %s ignored: %s is in use\n", scenario_override, loaded_path);
        ret = NVML_ERROR_IN_USE;
    }
    if (ret == NVML_SUCCESS) {
        refcount++;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlInit(void) { return do_init(); }
nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else {
        refcount--;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    size_t need = strlen(src) + 1;
    if (length < need) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = refcount == 0 ? NVML_ERROR_UNINITIALIZED : copy_string(version, length, driver_version);
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    char nvml_version[96];
    snprintf(nvml_version, sizeof nvml_version, "12.%s", driver_version);
    nvmlReturn_t ret = refcount == 0 ? NVML_ERROR_UNINITIALIZED : copy_string(version, length, nvml_version);
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t get_count(unsigned int *count) {
    if (count == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else {
        *count = (unsigned int)device_count;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return get_count(count); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return get_count(count); }

/* The fault state of a device at time t, before any per-function injection. */
static nvmlReturn_t device_fault(const mock_device *dev, double t) {
    if (dev->lost_at >= 0 && t >= dev->lost_at) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (dev->reset_at >= 0 && t >= dev->reset_at) {
        return NVML_ERROR_RESET_REQUIRED;
    }
    return NVML_SUCCESS;
}

/*
 * Common prologue of every per-device call: takes the lock (kept on success, released on error),
 * checks init and the handle, then hardware faults and injected errors for function f.
 * samples_tick: this call is a memory query, which advances the "samples" clock.
 */
static nvmlReturn_t enter(nvmlDevice_t dev, int f, int samples_tick) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (dev < devices || dev >= devices + device_count) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (f >= 0 && dev->errors[f].code == NVML_ERROR_FUNCTION_NOT_FOUND) {
        /* A function the "driver" lacks: no call happens, so the samples clock does not move. */
        ret = NVML_ERROR_FUNCTION_NOT_FOUND;
    } else {
        if (samples_tick) {
            dev->samples++;
        }
        double t = device_time(dev);
        ret = device_fault(dev, t);
        const injected_error *err = f >= 0 ? &dev->errors[f] : NULL;
        if (ret == NVML_SUCCESS && err != NULL && err->code != 0 && t >= err->from &&
            (err->until < 0 || t < err->until)) {
            ret = err->code;
        }
    }
    if (ret != NVML_SUCCESS) {
        pthread_mutex_unlock(&lock);
    }
    return ret;
}

static nvmlReturn_t leave(nvmlReturn_t ret) {
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (device == NULL || index >= (unsigned int)device_count) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        ret = device_fault(&devices[index], device_time(&devices[index]));
        if (ret == NVML_SUCCESS) {
            *device = &devices[index];
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_ERROR_NOT_FOUND;
    if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (uuid == NULL || device == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        for (int i = 0; i < device_count; i++) {
            if (strcmp(devices[i].uuid, uuid) == 0) {
                ret = device_fault(&devices[i], device_time(&devices[i]));
                if (ret == NVML_SUCCESS) {
                    *device = &devices[i];
                }
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t ret = enter(device, -1, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (index == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)(device - devices);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t ret = enter(device, F_UUID, 0);
    if (ret != NVML_SUCCESS) return ret;
    return leave(copy_string(uuid, length, device->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret = enter(device, F_NAME, 0);
    if (ret != NVML_SUCCESS) return ret;
    return leave(copy_string(name, length, device->name));
}

/* Allocated (v2 "used") and reserved memory now, clamped to the total. */
static void memory_now(const mock_device *dev, double *used_mib, double *reserved_mib) {
    double reserved = dev->reserved_mib < dev->total_mib ? dev->reserved_mib : dev->total_mib;
    double used = series_at(&dev->used_mib, device_time(dev));
    if (used < 0) used = 0;
    if (used > dev->total_mib - reserved) used = dev->total_mib - reserved;
    *used_mib = used;
    *reserved_mib = reserved;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = enter(device, F_MEMORY, 1);
    if (ret != NVML_SUCCESS) return ret;
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    double used = 0, reserved = 0;
    memory_now(device, &used, &reserved);
    /* v1 counts reserved memory as used, as the real driver does. */
    memory->total = (unsigned long long)(device->total_mib * MIB);
    memory->used = (unsigned long long)((used + reserved) * MIB);
    memory->free = memory->total - memory->used;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret = enter(device, F_MEMORY_V2, 1);
    if (ret != NVML_SUCCESS) return ret;
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)) {
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    double used = 0, reserved = 0;
    memory_now(device, &used, &reserved);
    memory->total = (unsigned long long)(device->total_mib * MIB);
    memory->reserved = (unsigned long long)(reserved * MIB);
    memory->used = (unsigned long long)(used * MIB);
    memory->free = memory->total - memory->reserved - memory->used;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    nvmlReturn_t ret = enter(device, F_UTILIZATION, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (utilization == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = device->util_gpu;
    utilization->memory = device->util_mem;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    nvmlReturn_t ret = enter(device, F_TEMPERATURE, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (temp == NULL || sensor != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = device->temperature_c;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature) {
    nvmlReturn_t ret = enter(device, F_TEMPERATURE_V, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (temperature == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != NVML_STRUCT_VERSION(sizeof(nvmlTemperature_v1_t), 1)) {
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    if (temperature->sensorType != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    temperature->temperature = (int)device->temperature_c;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    nvmlReturn_t ret = enter(device, F_POWER, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (power == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *power = device->power_mw;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    int f = type == 0 ? F_CLOCK_GRAPHICS : type == 1 ? F_CLOCK_SM : type == 2 ? F_CLOCK_MEM : -1;
    if (f < 0 || clock == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t ret = enter(device, f, 0);
    if (ret != NVML_SUCCESS) return ret;
    *clock = type == 0 ? device->clock_graphics : type == 1 ? device->clock_sm : device->clock_mem;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    nvmlReturn_t ret = enter(device, F_ECC, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (count == NULL || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    /* The same counts for volatile and aggregate: error_type 1 uncorrected, 0 corrected. */
    *count = (unsigned long long)step_at(error_type == 1 ? &device->ecc_uncorrected : &device->ecc_corrected,
                                         device_time(device));
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t retired_pages(nvmlDevice_t device, int cause, unsigned int *count,
                                  unsigned long long *addresses, unsigned long long *timestamps) {
    nvmlReturn_t ret = enter(device, F_RETIRED_PAGES, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (count == NULL || cause < 0 || cause > 1) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int have = cause == 0 ? device->retired_sbe : device->retired_dbe;
    if (addresses == NULL || *count < have) {
        *count = have;
        return leave(have == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < have; i++) {
        addresses[i] = 0x100000ULL * (unsigned long long)(cause + 1) + 0x1000ULL * i;
        if (timestamps != NULL) {
            timestamps[i] = 1700000000ULL + i;
        }
    }
    *count = have;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                       unsigned long long *addresses) {
    return retired_pages(device, cause, count, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause, unsigned int *count,
                                          unsigned long long *addresses, unsigned long long *timestamps) {
    return retired_pages(device, cause, count, addresses, timestamps);
}

/* The parent of pid (field 4 of /proc/PID/stat, after the comm's closing parenthesis); 0 if unknown. */
static unsigned long parent_of(unsigned long pid) {
    char path[64];
    char stat[512];
    snprintf(path, sizeof path, "/proc/%lu/stat", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        return 0;
    }
    size_t n = fread(stat, 1, sizeof stat - 1, file);
    fclose(file);
    stat[n] = '\0';
    const char *after_comm = strrchr(stat, ')');
    unsigned long ppid = 0;
    if (after_comm == NULL || sscanf(after_comm + 1, " %*c %lu", &ppid) != 1) {
        return 0;
    }
    return ppid;
}

/* Whether pid descends from ancestor (bounded walk: a ppid loop or a deep tree ends it). */
static int descends_from(unsigned long pid, unsigned long ancestor) {
    for (int depth = 0; depth < 256 && pid > 1; depth++) {
        pid = parent_of(pid);
        if (pid == ancestor) {
            return 1;
        }
    }
    return 0;
}

/* Whether the command line of pid contains needle (its arguments joined by spaces, 4 KiB read). */
static int cmdline_contains(unsigned long pid, const char *needle) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%lu/cmdline", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        return 0;
    }
    char cmdline[4096];
    size_t n = fread(cmdline, 1, sizeof cmdline - 1, file);
    fclose(file);
    for (size_t i = 0; i < n; i++) {
        if (cmdline[i] == '\0') {
            cmdline[i] = ' ';
        }
    }
    cmdline[n] = '\0';
    return n > 0 && strstr(cmdline, needle) != NULL;
}

/* The lowest PID (not ours) whose command line contains needle, among our own descendants when
 * any matches (a local sidecar's trainer: other runs on the same host use GPUs of their own), else,
 * unless one of ours matched before, among every process we see (a pod: the trainer is a sibling
 * container's process); 0 when none does. */
static unsigned int find_by_cmdline(const char *needle) {
    DIR *proc = opendir("/proc");
    if (proc == NULL) {
        return 0;
    }
    unsigned long best = 0;
    unsigned long best_descendant = 0;
    unsigned long self = (unsigned long)getpid();
    struct dirent *entry;
    while ((entry = readdir(proc)) != NULL) {
        if (!isdigit((unsigned char)entry->d_name[0])) {
            continue;
        }
        unsigned long pid = strtoul(entry->d_name, NULL, 10);
        if (pid == self || (best_descendant != 0 && pid >= best_descendant) || !cmdline_contains(pid, needle)) {
            continue;
        }
        if (descends_from(pid, self)) {
            best_descendant = pid;
        } else if (best == 0 || pid < best) {
            best = pid;
        }
    }
    closedir(proc);
    if (best_descendant != 0) {
        descendants_only = 1;
        return (unsigned int)best_descendant;
    }
    return descendants_only ? 0U : (unsigned int)best;
}

/* A pid spec resolved now: 0 when a placeholder names nothing (that process is not running). */
static unsigned int resolve_pid(const char *spec) {
    char buffer[64];
    const char *text = spec;
    if (spec[0] == '~') {
        return find_by_cmdline(spec + 1);
    }
    if (spec[0] == '$') {
        text = getenv(spec + 1);
        if (text == NULL) {
            return 0;
        }
    } else if (spec[0] == '@') {
        FILE *file = fopen(spec + 1, "r");
        if (file == NULL) {
            return 0;
        }
        char *got = fgets(buffer, sizeof buffer, file);
        fclose(file);
        if (got == NULL) {
            return 0;
        }
        text = buffer;
    }
    char *end = NULL;
    unsigned long pid = strtoul(text, &end, 10);
    if (end == text || pid == 0 || pid > 0x7FFFFFFFUL) {
        return 0;
    }
    return (unsigned int)pid;
}

static nvmlReturn_t running_processes(nvmlDevice_t device, int graphics, unsigned int *count,
                                      nvmlProcessInfo_t *infos) {
    nvmlReturn_t ret = enter(device, graphics ? F_GRAPHICS_PROCESSES : F_COMPUTE_PROCESSES, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (count == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlProcessInfo_t found[MAX_PROCS];
    unsigned int have = 0;
    double t = device_time(device);
    for (int i = 0; i < device->process_count; i++) {
        const mock_process *proc = &device->processes[i];
        unsigned int pid = proc->graphics == graphics ? resolve_pid(proc->pid_spec) : 0;
        if (pid == 0) {
            continue;
        }
        found[have].pid = pid;
        found[have].usedGpuMemory = (unsigned long long)(series_at(&proc->used_mib, t) * MIB);
        found[have].gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        found[have].computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        have++;
    }
    if (infos == NULL || *count < have) {
        *count = have;
        return leave(have == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    memcpy(infos, found, have * sizeof *infos);
    *count = have;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return running_processes(device, 0, count, infos);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return running_processes(device, 0, count, infos);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    return running_processes(device, 1, count, infos);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    return running_processes(device, 1, count, infos);
}

/* ---- health: row remapping, pending retirements, clock event reasons, PCIe replays, NVLink ---- */

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    nvmlReturn_t ret = enter(device, F_REMAPPED_ROWS, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (corr == NULL || unc == NULL || pending == NULL || failure == NULL) {
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    *corr = device->remap_corr;
    *unc = device->remap_unc;
    *pending = device->remap_pending;
    *failure = device->remap_failure;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    nvmlReturn_t ret = enter(device, F_RETIRED_PAGES_PENDING, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (pending == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *pending = device->retired_pending ? 1 : 0;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t clock_reasons(nvmlDevice_t device, int f, unsigned long long *reasons) {
    nvmlReturn_t ret = enter(device, f, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (reasons == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = step_at(&device->clock_reasons, device_time(device));
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return clock_reasons(device, F_CLOCK_EVENT_REASONS, reasons);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return clock_reasons(device, F_CLOCK_THROTTLE_REASONS, reasons);
}

/* nvmlFieldValue_t as nvml.h lays it out (the value a union of 8 bytes). Only the recovery action
   field is modelled; every other field answers NOT_SUPPORTED in its own nvmlReturn. */
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    unsigned int valueType;
    unsigned int nvmlReturn;
    unsigned long long value;
} nvmlFieldValue_t;

#define FI_DEV_GET_GPU_RECOVERY_ACTION 230

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    nvmlReturn_t ret = enter(device, F_FIELD_VALUES, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (values == NULL || count < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < count; i++) {
        values[i].timestamp = 0;
        values[i].latencyUsec = 0;
        values[i].value = 0;
        if (values[i].fieldId == FI_DEV_GET_GPU_RECOVERY_ACTION && device->recovery_action >= 0) {
            values[i].valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
            values[i].nvmlReturn = NVML_SUCCESS;
            values[i].value = (unsigned long long)device->recovery_action;
        } else {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    nvmlReturn_t ret = enter(device, F_PCIE_REPLAY, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (value == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *value = (unsigned int)series_at(&device->pcie_replay, device_time(device));
    return leave(NVML_SUCCESS);
}

/* A device without NVLink answers NOT_SUPPORTED; a link past the device's last, INVALID_ARGUMENT. */
static nvmlReturn_t enter_link(nvmlDevice_t device, unsigned int link) {
    nvmlReturn_t ret = enter(device, F_NVLINK, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (device->link_count == 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned int)device->link_count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *active) {
    nvmlReturn_t ret = enter_link(device, link);
    if (ret != NVML_SUCCESS) return ret;
    if (active == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *active = device->links[link].active ? 1 : 0;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                             unsigned long long *value) {
    nvmlReturn_t ret = enter_link(device, link);
    if (ret != NVML_SUCCESS) return ret;
    if (value == NULL || counter < 0 || counter > 4) return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* NVML_NVLINK_ERROR_DL_ECC_DATA (4) is not modelled: zero, as on links without ECC errors. */
    *value = counter < 4 ? device->links[link].counters[counter] : 0;
    return leave(NVML_SUCCESS);
}

/* ---- events: XID and ECC through an event set, as the device plugin and DCGM read them ---- */

typedef struct mock_event_set {
    unsigned long long mask[MAX_DEVICES];
    int next[MAX_DEVICES]; /* the first event of each device not yet delivered or skipped */
} mock_event_set;

typedef mock_event_set *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (no_event_api) {
        ret = NVML_ERROR_FUNCTION_NOT_FOUND;
    } else if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (set == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        *set = calloc(1, sizeof(mock_event_set));
        ret = *set == NULL ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (no_event_api) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    if (no_event_api) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t ret = enter(device, F_EVENTS, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (types == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *types = SUPPORTED_EVENTS;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    if (no_event_api) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t ret = enter(device, F_EVENTS, 0);
    if (ret != NVML_SUCCESS) return ret;
    if (set == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((types & ~SUPPORTED_EVENTS) != 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    int index = (int)(device - devices);
    /* Only what happens from now on is delivered, as with a real driver. */
    double t = device_time(device);
    int next = 0;
    while (next < device->event_count && device->events[next].at < t) next++;
    if (set->mask[index] == 0) set->next[index] = next;
    set->mask[index] |= types;
    return leave(NVML_SUCCESS);
}

/* Called with the lock held: the next due event of a registered type, or 0. */
static int next_event(mock_event_set *set, nvmlEventData_t *data) {
    for (int i = 0; i < device_count; i++) {
        mock_device *dev = &devices[i];
        if (set->mask[i] == 0) continue;
        double t = device_time(dev);
        while (set->next[i] < dev->event_count && dev->events[set->next[i]].at <= t) {
            const mock_event *event = &dev->events[set->next[i]++];
            if ((event->type & set->mask[i]) != 0) {
                data->device = dev;
                data->eventType = event->type;
                data->eventData = event->data;
                data->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
                data->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
                return 1;
            }
        }
    }
    return 0;
}

/* Blocks up to timeoutms without holding the library lock, so other calls go on meanwhile. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (no_event_api) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&lock);
        if (refcount == 0) {
            pthread_mutex_unlock(&lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        int found = next_event(set, data);
        pthread_mutex_unlock(&lock);
        if (found) return NVML_SUCCESS;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited_ms = (double)(now.tv_sec - start.tv_sec) * 1e3 + (double)(now.tv_nsec - start.tv_nsec) / 1e6;
        if (waited_ms >= (double)timeoutms) return NVML_ERROR_TIMEOUT;
        double nap_ms = (double)timeoutms - waited_ms < 2.0 ? (double)timeoutms - waited_ms : 2.0;
        struct timespec nap = {0, (long)(nap_ms * 1e6)};
        nanosleep(&nap, NULL);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
