/*
 * config/config_file.h - the JSON config file: one object whose keys are the
 * settings' file keys (see `llmserve serve --help`), merged over what the
 * struct config already holds. Unknown keys and wrong types are errors: the
 * file is the operator's, and a typo must not pass silently.
 *
 * Private to config/; the only jansson user of config/. [before start]
 */
#ifndef LLMSERVE_CONFIG_CONFIG_FILE_H
#define LLMSERVE_CONFIG_CONFIG_FILE_H

#include <stddef.h>

struct config;

/* Reads path and applies its keys to c. Returns 0, ERR_IO (cannot read; msg
 * says why) or ERR_INVAL (not JSON, not an object, unknown key, bad value;
 * msg names the key, or the line and column of a syntax error). */
int config_file_load(struct config *c, const char *path, char *msg, size_t msg_size);

/* The same for a JSON text in memory (len bytes); `name` labels messages. */
int config_file_parse(struct config *c, const char *text, size_t len, const char *name, char *msg,
                      size_t msg_size);

#endif
