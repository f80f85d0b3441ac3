/*
 * server/lora_path.h - where runtime adapter loads may read: the path a
 * client gives POST /v1/load_lora_adapter, confined to the directory of
 * --lora-dir.
 *
 * The directory is opened once at start-up (lora_path_root_open()) and
 * stays open for the server's life. A load is checked twice, and the
 * second check is the open itself, so nothing can change between them:
 *   lora_path_check()  [HTTP thread] the path as written, without touching
 *                      the file system: no `..` component; an absolute path
 *                      must be written under the directory's canonical path
 *                      (on a directory boundary: /srv/loras-old is not in
 *                      /srv/loras); a relative one is taken in it.
 *   lora_path_open()   [loader thread] walks that path from the open
 *                      directory one component at a time with
 *                      openat(O_NOFOLLOW): a symlink anywhere on the way is
 *                      refused, and the adapter is loaded from the
 *                      descriptor this returns (engine_adapter_load_fd()),
 *                      never by name again. A PEFT or bottleneck directory's
 *                      own files are opened in that descriptor the same way
 *                      (ENGINE_ADAPTER_LOAD_NO_SYMLINKS).
 * So someone who can write into the directory cannot swap a symlink in
 * between the check and the load. Symlinks are refused even when they stay
 * inside: following one safely would mean resolving it by hand.
 *
 * A path outside the directory gets the same answer whether or not it
 * exists (it is refused before anything is looked at), so the answer never
 * tells whether a file outside exists.
 *
 * Threads: as tagged above; both are pure functions of the file system and
 * the root, which is immutable while open. [any thread]
 */
#ifndef SERVER_LORA_PATH_H
#define SERVER_LORA_PATH_H

#include <limits.h>
#include <stddef.h>

struct lora_path_root {
    int fd;               // owned: the directory (O_DIRECTORY), -1 when closed
    char real[PATH_MAX];  // its canonical path (realpath), no trailing '/' unless "/"
};

/* Opens dir (--lora-dir) as the root of runtime loads into *out. Returns 0,
 * ERR_NOTFOUND (dir does not exist), ERR_INVAL (not a directory, too long,
 * cannot be opened), with a message in msg; on failure out->fd is -1.
 * [before start] */
int lora_path_root_open(const char *dir, struct lora_path_root *out, char *msg, size_t msg_size);

/* Closes the directory; safe on a closed root. [after stop] */
void lora_path_root_close(struct lora_path_root *root);

/* Checks a client's path as written (no file system access): on success out
 * [out_size] holds it as an absolute path under root->real, with `.` and
 * empty components dropped, for lora_path_open(). Returns 0; ERR_INVAL for
 * an empty path, a `..` component or one too long; ERR_PERM for an absolute
 * path not under root->real. msg says which, naming the path as given (at
 * most 200 bytes of it). */
int lora_path_check(const struct lora_path_root *root, const char *path, char *out,
                    size_t out_size, char *msg, size_t msg_size);

/* Opens checked (lora_path_check()'s output) by walking it from root->fd,
 * each component with openat(O_NOFOLLOW), so the object opened is the one
 * inside the directory whatever happens to its names meanwhile. On success
 * *out_fd is an open descriptor (O_CLOEXEC) of a directory or a regular
 * file, owned by the caller (close()). Returns 0; ERR_PERM when a component
 * is a symlink (or checked is not under root->real); ERR_NOTFOUND when a
 * component does not exist or a file is used as a directory; ERR_INVAL when
 * the object is neither a directory nor a regular file; ERR_IO for other
 * failures. Then *out_fd is -1 and msg says why, naming checked. A FIFO is
 * not waited on (opened non-blocking, then refused). */
int lora_path_open(const struct lora_path_root *root, const char *checked, int *out_fd,
                   char *msg, size_t msg_size);

#endif // SERVER_LORA_PATH_H
