/* The collectives seam: the in-process communicators (threads of one process, each rank its
 * own CPU backend) sum F32, F16 and BF16 tensors in rank order, every rank getting the same
 * bits, and gather column blocks side by side; shapes that disagree are refused. And NCCL
 * loaded at run time: where libnccl.so.2 is found its version is read and communicators for
 * backends that are not CUDA are refused; where not, the error names the library. */
#include "backend/backend.h"
#include "test.h"

#include <pthread.h>
#include <string.h>

#define RANKS 3
#define ROWS  2
#define COLS  5

typedef struct rank_job {
    be_comm *comm;
    be_backend *be;
    base_dtype dt;
    uint16_t h[ROWS * COLS]; /* the F16/BF16 tensor */
    float f[ROWS * COLS];    /* the F32 one */
    float part[ROWS * 2], full[ROWS * 2 * RANKS];
    int rc_sum, rc_gather, rc_bad;
    base_err err, bad;
} rank_job;

static float value(int rank, int i) {
    return (float)(rank + 1) * 0.37f + (float)i * 1.1f - 3.0f;
}

static void *rank_main(void *p) {
    rank_job *j = p;
    bool wide = j->dt == BASE_DTYPE_F32;
    be_tensor x = {wide ? (void *)j->f : (void *)j->h, j->dt, ROWS, COLS};
    j->rc_sum = j->comm->ops->all_reduce_sum(j->comm, j->be, &x, &j->err);
    be_tensor part = {j->part, BASE_DTYPE_F32, ROWS, 2};
    be_tensor full = {j->full, BASE_DTYPE_F32, ROWS, 2 * RANKS};
    j->rc_gather = j->comm->ops->all_gather_cols(j->comm, j->be, &part, &full, &j->err);
    be_tensor wrong = {j->full, BASE_DTYPE_F32, ROWS, 2 * RANKS - 1};
    j->rc_bad = j->comm->ops->all_gather_cols(j->comm, j->be, &part, &wrong, &j->bad);
    return NULL;
}

static uint16_t narrow(base_dtype dt, float v) {
    return dt == BASE_DTYPE_BF16 ? base_f32_to_bf16(v) : base_f32_to_f16(v);
}

static float widen(base_dtype dt, uint16_t h) {
    return dt == BASE_DTYPE_BF16 ? base_bf16_to_f32(h) : base_f16_to_f32(h);
}

static void run_dtype(base_dtype dt) {
    be_comm *comms[RANKS];
    base_err err;
    CHECK(be_comm_local_create(RANKS, comms, &err) == 0);
    rank_job jobs[RANKS];
    pthread_t th[RANKS];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < RANKS; r++) {
        jobs[r].comm = comms[r];
        jobs[r].dt = dt;
        CHECK(be_cpu_create(1, &jobs[r].be, &err) == 0);
        for (int i = 0; i < ROWS * COLS; i++) {
            jobs[r].f[i] = value(r, i);
            jobs[r].h[i] = narrow(dt == BASE_DTYPE_F32 ? BASE_DTYPE_BF16 : dt, value(r, i));
        }
        for (int i = 0; i < ROWS * 2; i++) jobs[r].part[i] = (float)(100 * r + i);
    }
    for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        CHECK_MSG(jobs[r].rc_sum == 0 && jobs[r].rc_gather == 0, "%s rank %d: %s",
                  base_dtype_name(dt), r, jobs[r].err.msg);
        for (int i = 0; i < ROWS * COLS; i++) {
            /* the sum in F32 in rank order, of what each rank held, then narrowed */
            float want = 0.0f;
            for (int q = 0; q < RANKS; q++)
                want += dt == BASE_DTYPE_F32 ? value(q, i) : widen(dt, narrow(dt, value(q, i)));
            if (dt == BASE_DTYPE_F32)
                CHECK_MSG(jobs[r].f[i] == want, "F32 rank %d [%d]: %g, want %g", r, i, jobs[r].f[i],
                          want);
            else
                CHECK_MSG(jobs[r].h[i] == narrow(dt, want), "%s rank %d [%d]: %g, want %g",
                          base_dtype_name(dt), r, i, widen(dt, jobs[r].h[i]), want);
        }
        /* row i of full: rank 0's part of row i, then rank 1's, then rank 2's */
        for (int i = 0; i < ROWS; i++)
            for (int q = 0; q < RANKS; q++)
                for (int c = 0; c < 2; c++)
                    CHECK(jobs[r].full[i * 2 * RANKS + q * 2 + c] == (float)(100 * q + i * 2 + c));
        CHECK_MSG(jobs[r].rc_bad != 0 && strstr(jobs[r].bad.msg, "is not 3 parts [2, 2]"),
                  "wrong shape: %s", jobs[r].rc_bad ? jobs[r].bad.msg : "accepted");
    }
    for (int r = 0; r < RANKS; r++) {
        comms[r]->ops->destroy(comms[r]);
        be_destroy(jobs[r].be);
    }
}

static void check_nccl(void) {
    be_nccl *nccl;
    base_err err;
    if (be_nccl_open(&nccl, &err) != 0) {
        printf("  NCCL not loaded: %s\n", err.msg);
        CHECK_MSG(strstr(err.msg, "libnccl.so.2"), "the error names the library: %s", err.msg);
        return;
    }
    int v = be_nccl_version(nccl);
    printf("  NCCL %d.%d.%d loaded\n", v / 10000, v / 100 % 100, v % 100);
    CHECK(v >= 21003);
    be_backend *cpu;
    CHECK(be_cpu_create(1, &cpu, &err) == 0);
    be_comm *comm;
    CHECK_MSG(be_comm_nccl_create(nccl, &cpu, 1, &comm, &err) != 0 &&
                  (strstr(err.msg, "rank 0's backend is not CUDA") ||
                   strstr(err.msg, "built without CUDA")),
              "a CPU backend refused: %s", err.msg);
    be_destroy(cpu);
    be_nccl_close(nccl);
}

int main(void) {
    run_dtype(BASE_DTYPE_F32);
    run_dtype(BASE_DTYPE_F16);
    run_dtype(BASE_DTYPE_BF16);
    base_err err;
    be_comm *none[1];
    CHECK(be_comm_local_create(0, none, &err) != 0 && strstr(err.msg, "0 ranks"));
    check_nccl();
    TEST_MAIN_END();
}
