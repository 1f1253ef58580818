// A C (and C++) caller of fairgo.h, run by `make capi-test` against
// libfairgo_sim.so: the header compiles warning-free in both languages and
// the calls behave as documented for a world of one rank.
#include <stdio.h>
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
	CHECK(strcmp(fairgo_result_string(FAIRGO_ERR_TIMEOUT), "FAIRGO_ERR_TIMEOUT") == 0);
	CHECK(strcmp(fairgo_last_error(), "") == 0);

	fairgo_config_t cfg;
	fairgo_config_init(&cfg);
	CHECK(cfg.struct_size == sizeof cfg && cfg.device == -1);
	cfg.op_timeout_ms = 60000;

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
