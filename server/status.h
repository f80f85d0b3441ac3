/*
 * status.h - the one ERR_* -> HTTP status table (STYLE 2.5) and OpenAI's
 * error "type" of a status. Pure functions, [any thread]; shared by the
 * daemon (http.c) and the handlers (routes.c).
 */
#ifndef SERVER_STATUS_H
#define SERVER_STATUS_H

/* ERR_INVAL, ERR_TOOLONG -> 400, ERR_NOTFOUND -> 404, ERR_FULL -> 429,
 * ERR_SHUTDOWN -> 503, ERR_CANCELED -> 499 is not HTTP: 500; others 500. */
int status_for_err(int err);

/* OpenAI's error "type" for a status. */
const char *status_error_type(int status);

#endif
