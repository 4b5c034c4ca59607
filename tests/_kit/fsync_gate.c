/* What a crash of the host would keep of a server's files: the bytes that were fsynced.
 *
 * Loaded into a Redis or Valkey server with LD_PRELOAD by tests/_kit/disk.py. Around each
 * fsync and fdatasync the server makes:
 *  - while the file named by AGENTFLOW_FSYNC_GATE exists, the call waits (a disk that stalls:
 *    nothing new reaches the platter, and whoever waits for the fsync waits too);
 *  - then it records "<size> <path>" in the file named by AGENTFLOW_FSYNC_LOG, the size read
 *    *before* the real call, so every byte it counts was written before the fsync began and
 *    is on disk when the call returns.
 * After a SIGKILL, cutting each file back to its last recorded size is what a power cut
 * would have left: the test's model of a host crash.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int (*sync_fn)(int);

static void hold_while_gated(void) {
    const char *gate = getenv("AGENTFLOW_FSYNC_GATE");
    struct stat st;
    struct timespec pause = {0, 5 * 1000 * 1000};
    while (gate != NULL && stat(gate, &st) == 0) {
        nanosleep(&pause, NULL);
    }
}

static void note(int fd, long long size) {
    const char *log = getenv("AGENTFLOW_FSYNC_LOG");
    char link[64], path[4096], line[4200];
    if (log == NULL || size < 0) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    int len = snprintf(line, sizeof line, "%lld %s\n", size, path);
    int out = open(log, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (out < 0) return;
    if (write(out, line, (size_t)len) < 0) { /* nothing to do: the line is lost, the size stays older */ }
    close(out);
}

static int synced(int fd, const char *name) {
    sync_fn real = (sync_fn)dlsym(RTLD_NEXT, name);
    struct stat st;
    hold_while_gated();
    long long size = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
    int result = real(fd);
    if (result == 0) note(fd, size);
    return result;
}

int fsync(int fd) { return synced(fd, "fsync"); }

int fdatasync(int fd) { return synced(fd, "fdatasync"); }
