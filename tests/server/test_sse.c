/* tests/server/test_sse.c - SSE framing as the spec (WHATWG event stream) defines it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "server/sse.h"

static void test_sse_frames(void **state) {
    (void)state;
    struct buf b = {0};
    sse_frame_data(&b, "{\"a\":1}");
    sse_frame_comment(&b, "keep-alive");
    sse_frame_done(&b);
    assert_string_equal(b.data, "data: {\"a\":1}\n\n: keep-alive\n\ndata: [DONE]\n\n");
    buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
