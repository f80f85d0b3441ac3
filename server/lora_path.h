/*
 * server/lora_path.h - where runtime adapter loads may read: the path a
 * client gives POST /v1/load_lora_adapter, confined to the directory of
 * --lora-dir.
 *
 * A path is taken when, with every symlink resolved (realpath), it names
 * the directory itself or something inside it (compared on directory
 * boundaries: /srv/loras-old is not inside /srv/loras). For a PEFT adapter
 * (a directory), the files the loader opens in it (adapter_config.json,
 * adapter_model.safetensors) are resolved too, so a symlink among them
 * cannot point out. A `..` component is refused before anything is looked
 * at. A path outside the directory gets the same answer whether or not it
 * exists, so the answer never tells whether a file outside exists.
 *
 * The check and the load are two steps: a client that can also write into
 * the directory could swap a file for a symlink between them. The
 * directory is the operator's; the threat here is a client of the API.
 *
 * Threads: pure functions of the file system. [any thread]
 */
#ifndef SERVER_LORA_PATH_H
#define SERVER_LORA_PATH_H

#include <stddef.h>

/* The canonical form of dir (realpath) into out [out_size]. Returns 0,
 * ERR_NOTFOUND (dir does not exist), ERR_INVAL (not a directory, or too
 * long), with a message in msg. For --lora-dir at start-up. */
int lora_path_dir(const char *dir, char *out, size_t out_size, char *msg, size_t msg_size);

/* Resolves a client's path against dir_real (lora_path_dir()'s output): a
 * relative path is taken inside it. On success out [out_size] holds the
 * resolved path for the loader. Returns 0; ERR_INVAL for an empty path, a
 * `..` component or one too long; ERR_PERM when it resolves outside the
 * directory (or, written outside it, does not resolve); ERR_NOTFOUND when it is inside but does not exist.
 * msg says which, naming the path as given (at most 200 bytes of it). */
int lora_path_resolve(const char *dir_real, const char *path, char *out, size_t out_size,
                      char *msg, size_t msg_size);

#endif // SERVER_LORA_PATH_H
