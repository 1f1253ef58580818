// A C (and C++) caller of fairgo.h, run by `make capi-test` against
// libfairgo_sim.so: the header compiles warning-free in both languages and
// the calls behave as documented for a world of one rank, and for two
// ranks of a simulated job in this process (one thread each) that misuse
// the ABI: one rank's refused call, and close after calls every rank refused.
#define _POSIX_C_SOURCE 200809L /* setenv, clock_gettime */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fairgo.h"

#ifdef __cplusplus
extern "C" {
#endif
/* A test hook of libfairgo_sim.so (not in fairgo.h): device memory of a
 * communicator's simulated GPU. */
int fairgo_sim_alloc(fairgo_comm_t comm, int64_t bytes, uint64_t* ptr);
#ifdef __cplusplus
}
#endif

#define CHECK(cond)                                                             \
	do {                                                                        \
		if (!(cond)) {                                                          \
			fprintf(stderr, "%s:%d: %s failed (last error: %s)\n", __FILE__, \
			        __LINE__, #cond, fairgo_last_error());                      \
			return 1;                                                           \
		}                                                                       \
	} while (0)

/* One rank of a two-rank job: made (init) or closed (close) on a thread of
 * its own, since each waits for its peer. */
struct rank_job {
	int rank;
	const char* addr;
	fairgo_comm_t comm;
	int rc;
};

static void* init_rank(void* p) {
	struct rank_job* j = (struct rank_job*)p;
	fairgo_config_t cfg;
	fairgo_config_init(&cfg);
	j->rc = fairgo_init_rank(j->rank, 2, j->rank, 2, j->addr, &cfg, &j->comm);
	return NULL;
}

static void* close_rank(void* p) {
	struct rank_job* j = (struct rank_job*)p;
	j->rc = fairgo_comm_close(j->comm);
	return NULL;
}

/* Runs fn for both ranks at once; 0 when every thread ran. */
static int both(struct rank_job jobs[2], void* (*fn)(void*)) {
	pthread_t th[2];
	for (int r = 0; r < 2; r++) {
		if (pthread_create(&th[r], NULL, fn, &jobs[r]) != 0) return 1;
	}
	for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
	return 0;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Makes a two-rank job meeting through a store of its own. */
static int start_job(struct rank_job jobs[2], fairgo_store_t* store, char* addr, size_t addr_len) {
	CHECK(fairgo_store_serve("127.0.0.1:0", store, addr, addr_len) == FAIRGO_OK);
	for (int r = 0; r < 2; r++) {
		jobs[r].rank = r;
		jobs[r].addr = addr;
		jobs[r].comm = 0;
		jobs[r].rc = 0;
	}
	CHECK(both(jobs, init_rank) == 0 && jobs[0].rc == FAIRGO_OK && jobs[1].rc == FAIRGO_OK);
	return 0;
}

/* Two ranks misuse the ABI. */
static int two_ranks(void) {
	struct rank_job jobs[2];
	fairgo_store_t store = 0;
	char addr[64];
	uint64_t buf[2];
	fairgo_work_t work = 0;

	/* One rank refuses a call (an unknown dtype) its peer made validly:
	 * that rank gets FAIRGO_ERR_INVALID_ARGUMENT, its peer at once
	 * FAIRGO_ERR_MISMATCH naming the rank, the call and the reason. */
	CHECK(start_job(jobs, &store, addr, sizeof addr) == 0);
	for (int r = 0; r < 2; r++) CHECK(fairgo_sim_alloc(jobs[r].comm, 32, &buf[r]) == FAIRGO_OK);
	double start = now();
	CHECK(fairgo_allreduce(jobs[0].comm, (void*)(uintptr_t)buf[0], 8, FAIRGO_FLOAT32, FAIRGO_SUM, NULL, &work) == FAIRGO_OK);
	fairgo_work_t refused = 0;
	CHECK(fairgo_allreduce(jobs[1].comm, (void*)(uintptr_t)buf[1], 8, (fairgo_dtype_t)42, FAIRGO_SUM, NULL, &refused) ==
	      FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(fairgo_work_wait(work, 20000) == FAIRGO_ERR_MISMATCH);
	CHECK(strstr(fairgo_last_error(), "rank 1 refused call 1 (allreduce of 8 float32)") != NULL);
	CHECK(strstr(fairgo_last_error(), "unknown element type") != NULL);
	CHECK(now() - start < 10);
	CHECK(fairgo_work_free(work) == FAIRGO_OK);
	CHECK(both(jobs, close_rank) == 0); /* broken communicators: close reports what it may */
	CHECK(fairgo_store_close(store) == FAIRGO_OK);

	/* Calls every rank refuses leave close nothing to wait for, every time. */
	double slowest = 0;
	for (int run = 0; run < 6; run++) {
		CHECK(start_job(jobs, &store, addr, sizeof addr) == 0);
		for (int r = 0; r < 2; r++) {
			CHECK(fairgo_sim_alloc(jobs[r].comm, 32, &buf[r]) == FAIRGO_OK);
			CHECK(fairgo_allreduce(jobs[r].comm, (void*)(uintptr_t)buf[r], 8, (fairgo_dtype_t)42, FAIRGO_SUM, NULL,
			                       &refused) == FAIRGO_ERR_INVALID_ARGUMENT);
		}
		start = now();
		CHECK(both(jobs, close_rank) == 0 && jobs[0].rc == FAIRGO_OK && jobs[1].rc == FAIRGO_OK);
		double took = now() - start;
		if (took > slowest) slowest = took;
		CHECK(fairgo_store_close(store) == FAIRGO_OK);
	}
	CHECK(slowest < 1.0);
	printf("abi_smoke: slowest close after refused calls: %.1f ms\n", slowest * 1e3);
	return 0;
}

int main(void) {
	CHECK(fairgo_abi_version() == FAIRGO_ABI_VERSION);
	CHECK(strcmp(fairgo_version(), FAIRGO_VERSION) == 0);
	CHECK(fairgo_version() == fairgo_version()); /* static storage, not a copy per call */
	CHECK(strcmp(fairgo_result_string(FAIRGO_ERR_TIMEOUT), "FAIRGO_ERR_TIMEOUT") == 0);
	CHECK(strcmp(fairgo_last_error(), "") == 0);

	fairgo_config_t cfg;
	fairgo_config_init(&cfg);
	CHECK(cfg.struct_size == sizeof cfg && cfg.device == -1 && cfg.algorithm == FAIRGO_ALGORITHM_AUTO);

	/* Settings from the environment; a bad value names its variable and changes nothing. */
	CHECK(setenv("FAIRGO_ALGORITHM", "flat", 1) == 0 && setenv("FAIRGO_TIMEOUT", "1.5", 1) == 0);
	CHECK(fairgo_config_from_env(&cfg) == FAIRGO_OK);
	CHECK(cfg.algorithm == FAIRGO_ALGORITHM_FLAT && cfg.op_timeout_ms == 1500);
	CHECK(setenv("FAIRGO_SLICE_BYTES", "lots", 1) == 0);
	CHECK(fairgo_config_from_env(&cfg) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(strstr(fairgo_last_error(), "FAIRGO_SLICE_BYTES") != NULL);
	CHECK(cfg.slice_bytes == 0);
	CHECK(unsetenv("FAIRGO_SLICE_BYTES") == 0 && unsetenv("FAIRGO_ALGORITHM") == 0 && unsetenv("FAIRGO_TIMEOUT") == 0);
	CHECK(fairgo_config_from_env(NULL) == FAIRGO_ERR_INVALID_ARGUMENT);
	cfg.op_timeout_ms = 60000;

	/* A caller built against ABI version 1 (no algorithm field) is still served. */
	fairgo_config_t v1;
	fairgo_config_init(&v1);
	v1.struct_size = (uint32_t)offsetof(fairgo_config_t, algorithm);
	fairgo_comm_t old = 0;
	CHECK(fairgo_init_rank(0, 1, 0, 1, NULL, &v1, &old) == FAIRGO_OK && old > 0);
	CHECK(fairgo_comm_close(old) == FAIRGO_OK);
	v1.struct_size = 8;
	CHECK(fairgo_init_rank(0, 1, 0, 1, NULL, &v1, &old) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(strstr(fairgo_last_error(), "struct_size") != NULL);

	fairgo_comm_t comm = 0;
	CHECK(fairgo_init_rank(3, 2, 0, 1, NULL, &cfg, &comm) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(strstr(fairgo_last_error(), "Rank") != NULL);
	CHECK(fairgo_init_rank(0, 1, 0, 1, NULL, &cfg, &comm) == FAIRGO_OK && comm > 0);

	fairgo_comm_info_t info;
	CHECK(fairgo_comm_info(comm, &info) == FAIRGO_OK);
	CHECK(info.rank == 0 && info.world_size == 1 && info.machines == 1 && info.devices == 1);
	int32_t algorithm = -1, settled = -1;
	CHECK(fairgo_comm_algorithm(comm, 1 << 20, &algorithm, &settled) == FAIRGO_OK);
	CHECK(algorithm == FAIRGO_ALGORITHM_FLAT && settled == 1); /* one rank: one flat call, by rule */
	CHECK(fairgo_comm_algorithm(comm, 1 << 20, NULL, NULL) == FAIRGO_OK);
	CHECK(fairgo_comm_algorithm(comm, -1, &algorithm, &settled) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(fairgo_comm_algorithm(987654, 0, &algorithm, &settled) == FAIRGO_ERR_BAD_HANDLE);

	fairgo_work_t work = 0;
	CHECK(fairgo_allreduce(comm, NULL, 0, FAIRGO_BFLOAT16, FAIRGO_AVG, NULL, &work) == FAIRGO_OK);
	int done = 0;
	/* Nothing to reduce, but the call still waits for the caller's stream. */
	CHECK(fairgo_work_wait(work, 5000) == FAIRGO_OK);
	CHECK(fairgo_work_test(work, &done) == FAIRGO_OK && done == 1);
	CHECK(fairgo_work_free(work) == FAIRGO_OK);
	CHECK(fairgo_work_free(work) == FAIRGO_ERR_BAD_HANDLE);
	CHECK(fairgo_work_stream_wait(work, NULL) == FAIRGO_ERR_BAD_HANDLE);
	/* The asynchronous call: the stream waits only when asked to. */
	CHECK(fairgo_allreduce_async(comm, NULL, 0, FAIRGO_FLOAT32, FAIRGO_SUM, NULL, &work) == FAIRGO_OK);
	CHECK(fairgo_work_stream_wait(work, NULL) == FAIRGO_OK);
	CHECK(fairgo_work_wait(work, 5000) == FAIRGO_OK);
	CHECK(fairgo_work_free(work) == FAIRGO_OK);
	CHECK(fairgo_allreduce_async(comm, NULL, 1, FAIRGO_FLOAT32, FAIRGO_SUM, NULL, &work) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(fairgo_allreduce_async(comm, NULL, 0, FAIRGO_FLOAT32, FAIRGO_SUM, NULL, NULL) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(fairgo_allreduce(comm, NULL, 1, FAIRGO_FLOAT32, FAIRGO_SUM, NULL, &work) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(fairgo_allreduce(comm, NULL, 0, (fairgo_dtype_t)42, FAIRGO_SUM, NULL, &work) == FAIRGO_ERR_INVALID_ARGUMENT);

	fairgo_store_t store = 0;
	char addr[64];
	CHECK(fairgo_store_serve("127.0.0.1:0", &store, addr, sizeof addr) == FAIRGO_OK);
	CHECK(strncmp(addr, "127.0.0.1:", 10) == 0);
	CHECK(fairgo_store_close(store) == FAIRGO_OK);
	CHECK(two_ranks() == 0);

	CHECK(fairgo_comm_close(comm) == FAIRGO_OK);
	CHECK(fairgo_comm_close(comm) == FAIRGO_ERR_BAD_HANDLE);
	printf("abi_smoke: ok\n");
	return 0;
}
