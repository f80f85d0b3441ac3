/*
 * tests/fuzz/fuzz_config.c - libFuzzer target: the JSON config file reader
 * (config_file_parse) and then config_validate() on what it accepted.
 * Input: the file's text. Oracle (config_file.h): 0 or ERR_INVAL with a
 * NUL-terminated message; config_deinit() frees everything (LeakSanitizer).
 * Seeds: tests/fuzz/corpus/config.
 */
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/config_file.h"
#include "engine/base/err.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct config c;
    config_init_defaults(&c);
    char msg[256];
    msg[0] = '\0';
    int err = config_file_parse(&c, (const char *)data, size, "fuzz.json", msg, sizeof(msg));
    if (err != 0 && (err != ERR_INVAL || !memchr(msg, '\0', sizeof(msg)))) abort();
    if (err == 0) (void)config_validate(&c, msg, sizeof(msg));
    config_deinit(&c);
    return 0;
}
