/*
 * test_comm.c - comm_split, the groups TP x PP runs its allreduces in.
 *
 * Without arguments: the one-process cases (a NULL comm splits into NULL).
 * `mpirun -np 4 test_comm --np 4` (tests/engine/meson.build, when the build
 * has MPI): every rank runs every test, the same collectives in the same
 * order, and checks values worked out by hand from the ranks' numbers:
 * ranks {0, 1} and {2, 3} as two groups, numbered in reverse by key, sums
 * and broadcasts that stay inside a group, a group's bytes counted in the
 * job's total, and the whole job still usable beside its groups; and the
 * max-allreduce and reduce-scatter of a KV cache divided over the ranks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/comm/comm.h"

static struct comm *world;  // NULL without --np

static void test_split_of_one_process_is_null(void **state) {
    (void)state;
    struct comm *g = (struct comm *)&g;
    assert_int_equal(comm_split(NULL, 0, 0, &g), 0);
    assert_null(g);
    assert_int_equal(comm_size(g), 1);
    assert_int_equal(comm_rank(g), 0);
    float x[2] = {1.5f, -2.0f};
    comm_allreduce_sum(g, x, 2);  // one rank: the sum is the value itself
    assert_true(x[0] == 1.5f && x[1] == -2.0f);
    comm_close(g);
}

/* Ranks {0, 1} and {2, 3} (color rank / 2), numbered by key 1 - rank % 2: world
 * rank 1 is rank 0 of the first group, world rank 3 of the second. */
static struct comm *split_pairs(void) {
    const int32_t r = comm_rank(world);
    struct comm *g = NULL;
    assert_int_equal(comm_split(world, r / 2, 1 - r % 2, &g), 0);
    assert_non_null(g);
    assert_int_equal(comm_size(g), 2);
    assert_int_equal(comm_rank(g), 1 - r % 2);
    return g;
}

static void test_allreduce_sums_within_the_group(void **state) {
    (void)state;
    if (!world) skip();
    const int32_t r = comm_rank(world);
    struct comm *g = split_pairs();
    float x[2] = {(float)(r + 1), 10.0f * (float)(r + 1)};
    comm_allreduce_sum(g, x, 2);
    // {1, 2} -> 3 for ranks 0 and 1, {3, 4} -> 7 for ranks 2 and 3
    const float want = r < 2 ? 3.0f : 7.0f;
    assert_true(x[0] == want && x[1] == 10.0f * want);
    // The job's own comm is untouched by the groups: 1 + 2 + 3 + 4.
    float y = (float)(r + 1);
    comm_allreduce_sum(world, &y, 1);
    assert_true(y == 10.0f);
    comm_close(g);
}

static void test_bcast_comes_from_the_groups_rank_0(void **state) {
    (void)state;
    if (!world) skip();
    const int32_t r = comm_rank(world);
    struct comm *g = split_pairs();
    int32_t v = 100 + r;
    comm_bcast(g, &v, sizeof(v));
    assert_int_equal(v, r < 2 ? 101 : 103);  // world ranks 1 and 3 lead their groups
    comm_close(g);
}

static void test_agree_within_the_group(void **state) {
    (void)state;
    if (!world) skip();
    const int32_t r = comm_rank(world);
    struct comm *g = split_pairs();
    // Only world rank 2 fails: its group agrees on the failure, the other group on 0.
    const int err = comm_agree(g, r == 2 ? ERR_NOMEM : 0);
    assert_int_equal(err, r < 2 ? 0 : ERR_NOMEM);
    comm_close(g);
}

static void test_send_recv_by_group_rank(void **state) {
    (void)state;
    if (!world) skip();
    const int32_t r = comm_rank(world);
    struct comm *g = split_pairs();
    float x[3] = {0};
    if (comm_rank(g) == 0) {
        const float mine[3] = {(float)r, 0.5f, -1.0f};
        comm_send(g, 1, mine, 3);
    } else {
        comm_recv(g, 0, x, 3);
        assert_true(x[0] == (float)(r + 1) && x[1] == 0.5f && x[2] == -1.0f);
    }
    comm_close(g);
}

/* The bytes a group sends are the job's too: a group allreduce of 2 floats
 * adds 8 bytes to both counters, a group broadcast of 4 bytes adds 4 on its
 * root (one other rank) and nothing on the receiver. */
static void test_group_bytes_count_in_the_job(void **state) {
    (void)state;
    if (!world) skip();
    struct comm *g = split_pairs();
    assert_int_equal(comm_bytes_sent(g), 0);
    const uint64_t w0 = comm_bytes_sent(world);
    float x[2] = {1.0f, 2.0f};
    comm_allreduce_sum(g, x, 2);
    assert_int_equal(comm_bytes_sent(g), 8);
    assert_int_equal(comm_bytes_sent(world) - w0, 8);
    int32_t v = 7;
    comm_bcast(g, &v, sizeof(v));
    const uint64_t want = comm_rank(g) == 0 ? 12 : 8;
    assert_int_equal(comm_bytes_sent(g), want);
    assert_int_equal(comm_bytes_sent(world) - w0, want);
    comm_close(g);
}

/* Every rank its own color: groups of one, whose sums are the values. */
static void test_groups_of_one(void **state) {
    (void)state;
    if (!world) skip();
    const int32_t r = comm_rank(world);
    struct comm *g = NULL;
    assert_int_equal(comm_split(world, r, 0, &g), 0);
    assert_int_equal(comm_size(g), 1);
    assert_int_equal(comm_rank(g), 0);
    float x = (float)r;
    comm_allreduce_sum(g, &x, 1);
    assert_true(x == (float)r);
    comm_close(g);
}

/* The reductions of a KV cache divided over SP ranks (forward.c,
 * attend_divided), over the 4 ranks: the max of each element, and a
 * reduce-scatter whose parts are 1, 2, 0 and 3 floats (a rank may have no
 * tokens). Rank r contributes r + 1 + 10 i at element i, so every sum is
 * 4 x (10 i) + 1 + 2 + 3 + 4 = 40 i + 10, and rank r gets the elements after
 * the parts of the ranks before it. One process: the part is all. */
static void test_max_and_reduce_scatter(void **state) {
    (void)state;
    const int32_t r = comm_rank(world);
    float x[3] = {(float)r, -(float)r, r == 2 ? 7.0f : 0.5f};
    comm_allreduce_max(world, x, 3);
    if (world) assert_true(x[0] == 3.0f && x[1] == 0.0f && x[2] == 7.0f);
    else assert_true(x[0] == 0.0f && x[1] == 0.0f && x[2] == 0.5f);

    const int64_t counts[4] = {1, 2, 0, 3};
    const int64_t one[1] = {6};
    float all[6], mine[6] = {0};
    for (int i = 0; i < 6; i++) all[i] = (float)(r + 1 + 10 * i);
    const uint64_t b0 = comm_bytes_sent(world);
    comm_reduce_scatter_parts(world, all, world ? counts : one, mine);
    if (!world) {
        for (int i = 0; i < 6; i++) assert_true(mine[i] == (float)(1 + 10 * i));
        return;
    }
    const int first[4] = {0, 1, 3, 3};
    for (int i = 0; i < (int)counts[r]; i++) {
        assert_true(mine[i] == (float)(40 * (first[r] + i) + 10));
    }
    assert_int_equal(comm_bytes_sent(world) - b0, 6 * sizeof(float));  // handed: all of it
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--np") == 0) {
        if (comm_open(atoi(argv[2]), &world) != 0) return 1;
        if (comm_size(world) != 4) {
            comm_close(world);
            return 2;  // the hand-worked values are for 4 ranks
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_of_one_process_is_null),
        cmocka_unit_test(test_allreduce_sums_within_the_group),
        cmocka_unit_test(test_bcast_comes_from_the_groups_rank_0),
        cmocka_unit_test(test_agree_within_the_group),
        cmocka_unit_test(test_send_recv_by_group_rank),
        cmocka_unit_test(test_group_bytes_count_in_the_job),
        cmocka_unit_test(test_groups_of_one),
        cmocka_unit_test(test_max_and_reduce_scatter),
    };
    const int n_failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_close(world);
    return n_failed;
}
