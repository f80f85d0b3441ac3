/*
 * err.c - names and messages of the ERR_* codes, generated from ERR_MAP.
 */
#include "engine/base/err.h"

const char *err_name(int code) {
    switch (code) {
#define ERR_NAME_(name, value, msg) \
    case (value):                   \
        return "ERR_" #name;
        ERR_MAP(ERR_NAME_)
#undef ERR_NAME_
    }
    return code == 0 ? "OK" : "ERR_UNKNOWN";
}

const char *err_str(int code) {
    switch (code) {
#define ERR_STR_(name, value, msg) \
    case (value):                  \
        return msg;
        ERR_MAP(ERR_STR_)
#undef ERR_STR_
    }
    return code == 0 ? "success" : "unknown error";
}
