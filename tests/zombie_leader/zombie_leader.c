/* A "zombie leader": main() leaves with pthread_exit while another thread runs on. /proc/PID then
 * shows state Z, RSS 0, no fds and no argv, though the process lives (and leaks) in its thread.
 * Usage: zombie_leader MIB PIPES [--fork]: the thread holds MIB MiB (touched) and PIPES pipes, with
 * --fork it first forks a child that does the same; it prints "ready PID" (and the child's) and waits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t mib;
static int pipes;

static void *hold(void *unused) {
    (void)unused;
    char *memory = malloc(mib << 20);
    if (memory == NULL) {
        return NULL;
    }
    memset(memory, 1, mib << 20);
    for (int i = 0; i < pipes; i++) {
        int ends[2];
        if (pipe(ends) != 0) {
            break;
        }
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        pause();
    }
    return memory;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: zombie_leader MIB PIPES [--fork]\n");
        return 2;
    }
    mib = (size_t)strtoul(argv[1], NULL, 10);
    pipes = atoi(argv[2]);
    if (argc > 3 && strcmp(argv[3], "--fork") == 0 && fork() < 0) {
        return 1;
    }
    pthread_t thread;
    if (pthread_create(&thread, NULL, hold, NULL) != 0) {
        return 1;
    }
    pthread_exit(NULL);
}
