/*
 * lora_path.c - runtime adapter paths confined to --lora-dir.
 */
#include "server/lora_path.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/base/err.h"

/* The files the PEFT loader opens inside an adapter directory
 * (engine/model/lora.c). */
static const char *const peft_files[] = {"adapter_config.json", "adapter_model.safetensors"};

int lora_path_dir(const char *dir, char *out, size_t out_size, char *msg, size_t msg_size) {
    char real[PATH_MAX];
    if (!realpath(dir, real)) {
        snprintf(msg, msg_size, "--lora-dir %s: %s", dir, strerror(errno));
        return errno == ENOENT ? ERR_NOTFOUND : ERR_INVAL;
    }
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(msg, msg_size, "--lora-dir %s: not a directory", dir);
        return ERR_INVAL;
    }
    if (strlen(real) >= out_size) {
        snprintf(msg, msg_size, "--lora-dir %s: path too long", dir);
        return ERR_INVAL;
    }
    strcpy(out, real);
    return 0;
}

/* Whether path is dir or below it, on a directory boundary. dir has no
 * trailing slash unless it is "/". */
static bool is_inside(const char *dir, const char *path) {
    size_t n = strlen(dir);
    if (strncmp(path, dir, n) != 0) return false;
    if (n > 0 && dir[n - 1] == '/') return true;  // dir is "/"
    return path[n] == '\0' || path[n] == '/';
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

int lora_path_resolve(const char *dir_real, const char *path, char *out, size_t out_size,
                      char *msg, size_t msg_size) {
    if (!path[0]) {
        snprintf(msg, msg_size, "'lora_path' is empty");
        return ERR_INVAL;
    }
    if (has_dotdot(path)) {
        snprintf(msg, msg_size, "'lora_path' %.200s: '..' is not allowed", path);
        return ERR_INVAL;
    }
    char joined[PATH_MAX];
    int n = path[0] == '/' ? snprintf(joined, sizeof(joined), "%s", path)
                           : snprintf(joined, sizeof(joined), "%s/%s", dir_real, path);
    if (n < 0 || (size_t)n >= sizeof(joined)) {
        snprintf(msg, msg_size, "'lora_path' is too long");
        return ERR_INVAL;
    }
    // Outside as written and not there once resolved: refused alike whether
    // or not it exists, so the answer tells nothing of files outside.
    const bool is_written_inside = is_inside(dir_real, joined);
    char real[PATH_MAX];
    if (!realpath(joined, real)) {
        int e = errno;
        if (!is_written_inside) {
            snprintf(msg, msg_size,
                     "'lora_path' %.200s is outside the server's adapter directory", path);
            return ERR_PERM;
        }
        snprintf(msg, msg_size, "'lora_path' %.200s: %s", path, strerror(e));
        return e == ENOENT || e == ENOTDIR ? ERR_NOTFOUND : ERR_INVAL;
    }
    if (!is_inside(dir_real, real)) {
        snprintf(msg, msg_size,
                 "'lora_path' %.200s is outside the server's adapter directory%s", path,
                 is_written_inside ? " (through a symlink)" : "");
        return ERR_PERM;
    }
    struct stat st;
    if (stat(real, &st) == 0 && S_ISDIR(st.st_mode)) {
        for (size_t i = 0; i < sizeof(peft_files) / sizeof(peft_files[0]); i++) {
            char file[PATH_MAX];
            char file_real[PATH_MAX];
            n = snprintf(file, sizeof(file), "%s/%s", real, peft_files[i]);
            if (n < 0 || (size_t)n >= sizeof(file)) continue;  // the loader reports it
            if (!realpath(file, file_real)) continue;  // absent: the loader reports it
            if (!is_inside(dir_real, file_real)) {
                snprintf(msg, msg_size,
                         "'lora_path' %.200s: its %s leads outside the server's adapter "
                         "directory (a symlink)",
                         path, peft_files[i]);
                return ERR_PERM;
            }
        }
    }
    if (strlen(real) >= out_size) {
        snprintf(msg, msg_size, "'lora_path' is too long");
        return ERR_INVAL;
    }
    strcpy(out, real);
    return 0;
}
