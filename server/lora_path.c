/*
 * lora_path.c - runtime adapter paths confined to --lora-dir, opened without
 * following symlinks.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/lora_path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/err.h"

int lora_path_root_open(const char *dir, struct lora_path_root *out, char *msg, size_t msg_size) {
    out->fd = -1;
    out->real[0] = '\0';
    char real[PATH_MAX];
    if (!realpath(dir, real)) {
        snprintf(msg, msg_size, "--lora-dir %s: %s", dir, strerror(errno));
        return errno == ENOENT ? ERR_NOTFOUND : ERR_INVAL;
    }
    if (strlen(real) >= sizeof(out->real)) {
        snprintf(msg, msg_size, "--lora-dir %s: path too long", dir);
        return ERR_INVAL;
    }
    int fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, msg_size, "--lora-dir %s: %s", dir,
                 errno == ENOTDIR ? "not a directory" : strerror(errno));
        return ERR_INVAL;
    }
    out->fd = fd;
    strcpy(out->real, real);
    return 0;
}

void lora_path_root_close(struct lora_path_root *root) {
    if (root->fd >= 0) close(root->fd);
    root->fd = -1;
}

/* The length of root's prefix in path when path is root or below it, on a
 * directory boundary; 0 otherwise. */
static size_t inside_prefix(const char *root, const char *path) {
    size_t n = strlen(root);
    if (strncmp(path, root, n) != 0) return 0;
    if (n > 0 && root[n - 1] == '/') return n;  // root is "/"
    return path[n] == '\0' || path[n] == '/' ? n : 0;
}

static bool has_dotdot(const char *path) {
    for (const char *p = path; *p;) {
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.') return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

int lora_path_check(const struct lora_path_root *root, const char *path, char *out,
                    size_t out_size, char *msg, size_t msg_size) {
    if (!path[0]) {
        snprintf(msg, msg_size, "'lora_path' is empty");
        return ERR_INVAL;
    }
    if (has_dotdot(path)) {
        snprintf(msg, msg_size, "'lora_path' %.200s: '..' is not allowed", path);
        return ERR_INVAL;
    }
    const char *rel = path;
    if (path[0] == '/') {
        size_t n = inside_prefix(root->real, path);
        if (n == 0) {
            snprintf(msg, msg_size,
                     "'lora_path' %.200s is outside the server's adapter directory", path);
            return ERR_PERM;
        }
        rel = path + n;
    }
    // root->real, then each component but "" and ".", one '/' before each.
    size_t len = strlen(root->real);
    if (len >= out_size) goto too_long;
    memcpy(out, root->real, len + 1);
    const bool is_root_slash = len == 1;  // "/": no second '/' after it
    for (const char *p = rel; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > 0 && !(n == 1 && p[0] == '.')) {
            const size_t sep = is_root_slash && len == 1 ? 0 : 1;
            if (len + sep + n >= out_size) goto too_long;
            if (sep) out[len++] = '/';
            memcpy(out + len, p, n);
            len += n;
            out[len] = '\0';
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;

too_long:
    snprintf(msg, msg_size, "'lora_path' is too long");
    return ERR_INVAL;
}

/* Why openat(dir, name, O_NOFOLLOW ...) failed with error e, as an ERR_* and
 * a message. */
static int open_failure(int dir, const char *name, int e, const char *checked, char *msg,
                        size_t msg_size) {
    struct stat st;
    if (e == ELOOP || ((e == ENOTDIR || e == EMLINK) &&
                       fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))) {
        snprintf(msg, msg_size,
                 "'lora_path' %.200s: '%.100s' is a symlink, and symlinks are not followed in "
                 "the server's adapter directory", checked, name);
        return ERR_PERM;
    }
    snprintf(msg, msg_size, "'lora_path' %.200s: %s", checked, strerror(e));
    return e == ENOENT || e == ENOTDIR ? ERR_NOTFOUND : ERR_IO;
}

int lora_path_open(const struct lora_path_root *root, const char *checked, int *out_fd,
                   char *msg, size_t msg_size) {
    *out_fd = -1;
    size_t n_root = inside_prefix(root->real, checked);
    if (n_root == 0 || root->fd < 0) {
        snprintf(msg, msg_size, "'lora_path' %.200s is outside the server's adapter directory",
                 checked);
        return ERR_PERM;
    }
    // O_NONBLOCK: a FIFO in the tree must not hold the loader (it is
    // refused below); it changes nothing for directories and regular files.
    const int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int cur = openat(root->fd, ".", O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    if (cur < 0) {
        snprintf(msg, msg_size, "'lora_path' %.200s: the adapter directory: %s", checked,
                 strerror(errno));
        return ERR_IO;
    }
    for (const char *p = checked + n_root; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *next = end ? end + 1 : p + n;
        if (n == 0) {
            p = next;
            continue;
        }
        char name[NAME_MAX + 1];
        if (n > NAME_MAX) {
            close(cur);
            snprintf(msg, msg_size, "'lora_path' %.200s: a name is too long", checked);
            return ERR_INVAL;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        if (strcmp(name, "..") == 0) {  // lora_path_check() never writes one
            close(cur);
            snprintf(msg, msg_size, "'lora_path' %.200s: '..' is not allowed", checked);
            return ERR_PERM;
        }
        const bool is_last = *next == '\0';
        int fd = openat(cur, name, flags | (is_last ? 0 : O_DIRECTORY));
        if (fd < 0) {
            int err = open_failure(cur, name, errno, checked, msg, msg_size);
            close(cur);
            return err;
        }
        close(cur);
        cur = fd;
        p = next;
    }
    struct stat st;
    if (fstat(cur, &st) != 0 || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
        close(cur);
        snprintf(msg, msg_size,
                 "'lora_path' %.200s is neither a directory (PEFT, bottleneck) nor a file (GGUF)",
                 checked);
        return ERR_INVAL;
    }
    if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
        // Another name for the same file may be anywhere on the file system: a hard link
        // made in the directory to a file outside it cannot be told from one inside, so
        // none is taken (the files of a download or a copy have one name).
        close(cur);
        snprintf(msg, msg_size,
                 "'lora_path' %.200s has %ju hard links; only a file with one name is loaded",
                 checked, (uintmax_t)st.st_nlink);
        return ERR_PERM;
    }
    int fl = fcntl(cur, F_GETFL);
    if (fl >= 0) fcntl(cur, F_SETFL, fl & ~O_NONBLOCK);
    *out_fd = cur;
    return 0;
}
