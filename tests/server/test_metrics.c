/* tests/server/test_metrics.c - Prometheus text: gauges, counters and
 * cumulative histogram buckets in seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/metrics.h"

static void test_metrics_formats_gauges_and_histograms(void **state) {
    (void)state;
    double bounds[STATS_N_BUCKETS - 1];
    for (int i = 0; i < STATS_N_BUCKETS - 1; i++) bounds[i] = (double)(1 << i);
    struct scheduler_stats st = {.n_running = 3, .n_waiting = 2, .n_blocks_used = 7};
    st.ttft.counts[0] = 1;
    st.ttft.counts[2] = 2;
    st.ttft.counts[STATS_N_BUCKETS - 1] = 1;
    st.ttft.n = 4;
    st.ttft.sum_ms = 1500;
    struct metrics_server sv = {.n_http_requests = 9, .n_http_active = 3,
                                .n_lora_loads_queued = 2, .n_lora_loads_running = 1};
    struct buf b = {0};
    metrics_format(&b, &st, bounds, &sv);
    assert_non_null(strstr(b.data, "# TYPE llmserve_requests_running gauge\n"
                                   "llmserve_requests_running 3\n"));
    assert_non_null(strstr(b.data, "llmserve_requests_waiting 2\n"));
    assert_non_null(strstr(b.data, "llmserve_kv_blocks_used 7\n"));
    assert_non_null(strstr(b.data, "llmserve_http_requests_total 9\n"));
    assert_non_null(strstr(b.data, "llmserve_http_requests_in_progress 3\n"));
    assert_non_null(strstr(b.data, "llmserve_lora_loads_queued 2\n"));
    assert_non_null(strstr(b.data, "llmserve_lora_loads_running 1\n"));
    assert_non_null(strstr(b.data, "llmserve_time_to_first_token_seconds_bucket{le=\"0.001\"} 1\n"));
    assert_non_null(strstr(b.data, "llmserve_time_to_first_token_seconds_bucket{le=\"0.002\"} 1\n"));
    assert_non_null(strstr(b.data, "llmserve_time_to_first_token_seconds_bucket{le=\"0.004\"} 3\n"));
    assert_non_null(strstr(b.data, "llmserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\n"));
    assert_non_null(strstr(b.data, "llmserve_time_to_first_token_seconds_sum 1.500000\n"));
    assert_non_null(strstr(b.data, "llmserve_time_to_first_token_seconds_count 4\n"));
    buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_formats_gauges_and_histograms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
