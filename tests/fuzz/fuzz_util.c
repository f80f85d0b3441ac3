/*
 * tests/fuzz/fuzz_util.c - scratch files, quiet logs and data paths for the
 * fuzz targets (fuzz_util.h).
 */
#include "tests/fuzz/fuzz_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/log.h"

void fuzz_util_quiet_logs(void) {
    const char *keep = getenv("LLMSERVE_FUZZ_LOG");
    if (keep && strcmp(keep, "1") == 0) return;
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) log_set_fd(fd);
}

static char scratch[512];

/* Removes the scratch directory and what the targets left in it (files and
 * one level of subdirectories, which is all they make). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (e->d_type == DT_DIR) {
            remove_tree(path);
        } else {
            unlink(path);
        }
    }
    closedir(d);
    rmdir(dir);
}

static void remove_scratch(void) {
    if (scratch[0]) remove_tree(scratch);
}

const char *fuzz_util_scratch_dir(void) {
    if (scratch[0]) return scratch;
    // Without TMPDIR, /dev/shm (memory) when there is one: the loader targets
    // rewrite their input file at every execution, and on a disk file system
    // (ext4) replacing a file's contents by truncation flushes it to disk at
    // close, which cost those targets about half of their time.
    const char *tmp = getenv("TMPDIR");
    struct stat st;
    if (!tmp || !*tmp) {
        tmp = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0
                  ? "/dev/shm"
                  : "/tmp";
    }
    snprintf(scratch, sizeof(scratch), "%s/llmserve-fuzz-XXXXXX", tmp);
    if (!mkdtemp(scratch)) {
        perror("fuzz_util: mkdtemp");
        abort();
    }
    atexit(remove_scratch);
    return scratch;
}

const char *fuzz_util_write(const char *name, const void *data, size_t size) {
    static char path[1024];
    snprintf(path, sizeof(path), "%s/%s", fuzz_util_scratch_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz_util: write");
        abort();
    }
    return path;
}

const char *fuzz_util_data_path(const char *name) {
    static char path[1024];
    snprintf(path, sizeof(path), "%s/%s", FUZZ_DATA_DIR, name);
    return path;
}

const char *fuzz_util_shared_dir(void) {
    const char *s = getenv("LLMSERVE_SHARED");
    return s && *s ? s : FUZZ_SHARED_DIR;
}
