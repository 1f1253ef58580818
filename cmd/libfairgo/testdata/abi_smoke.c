// A C (and C++) caller of fairgo.h, run by `make capi-test` against
// libfairgo_sim.so: the header compiles warning-free in both languages and
// the calls behave as documented for a world of one rank.
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fairgo.h"

#define CHECK(cond)                                                             \
	do {                                                                        \
		if (!(cond)) {                                                          \
			fprintf(stderr, "%s:%d: %s failed (last error: %s)\n", __FILE__, \
			        __LINE__, #cond, fairgo_last_error());                      \
			return 1;                                                           \
		}                                                                       \
	} while (0)

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

	fairgo_work_t work = 0;
	CHECK(fairgo_allreduce(comm, NULL, 0, FAIRGO_BFLOAT16, FAIRGO_AVG, NULL, &work) == FAIRGO_OK);
	int done = 0;
	/* Nothing to reduce, but the call still waits for the caller's stream. */
	CHECK(fairgo_work_wait(work, 5000) == FAIRGO_OK);
	CHECK(fairgo_work_test(work, &done) == FAIRGO_OK && done == 1);
	CHECK(fairgo_work_free(work) == FAIRGO_OK);
	CHECK(fairgo_work_free(work) == FAIRGO_ERR_BAD_HANDLE);
	CHECK(fairgo_allreduce(comm, NULL, 1, FAIRGO_FLOAT32, FAIRGO_SUM, NULL, &work) == FAIRGO_ERR_INVALID_ARGUMENT);
	CHECK(fairgo_allreduce(comm, NULL, 0, (fairgo_dtype_t)42, FAIRGO_SUM, NULL, &work) == FAIRGO_ERR_INVALID_ARGUMENT);

	fairgo_store_t store = 0;
	char addr[64];
	CHECK(fairgo_store_serve("127.0.0.1:0", &store, addr, sizeof addr) == FAIRGO_OK);
	CHECK(strncmp(addr, "127.0.0.1:", 10) == 0);
	CHECK(fairgo_store_close(store) == FAIRGO_OK);

	CHECK(fairgo_comm_close(comm) == FAIRGO_OK);
	CHECK(fairgo_comm_close(comm) == FAIRGO_ERR_BAD_HANDLE);
	printf("abi_smoke: ok\n");
	return 0;
}
