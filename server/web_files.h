/*
 * server/web_files.h - the playground's files (server/web/), compiled into
 * the binary by scripts/embed-web: the generated web_files.c defines the
 * table below. Immutable data; [any thread].
 *
 * The files are plain HTML, CSS and JavaScript with no build step and no
 * outside origin; server/routes.c serves them at GET / (index.html) and at
 * GET /<name> under a Content-Security-Policy that allows only 'self'.
 */
#ifndef SERVER_WEB_FILES_H
#define SERVER_WEB_FILES_H

#include <stddef.h>
#include <stdint.h>

struct web_files_entry {
    const char *path;           // "/index.html": "/" + the file's name
    const char *content_type;   // from the extension, with charset for text
    const char *etag;           // quoted; changes whenever the bytes do
    const unsigned char *data;  // n_bytes bytes, not NUL-terminated
    size_t n_bytes;
};

extern const struct web_files_entry web_files[];
extern const int32_t web_files_count;

#endif // SERVER_WEB_FILES_H
