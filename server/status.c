/*
 * status.c - the ERR_* -> HTTP status table and the OpenAI error types.
 */
#include "server/status.h"

#include "engine/base/err.h"

int status_for_err(int err) {
    switch (err) {
    case 0: return 200;
    case ERR_INVAL: return 400;
    case ERR_TOOLONG: return 400;
    case ERR_PERM: return 403;
    case ERR_NOTFOUND: return 404;
    case ERR_FULL: return 429;
    case ERR_SHUTDOWN: return 503;
    default: return 500;
    }
}

const char *status_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 504: return "timeout";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}
