// The parts of libfairgo's C ABI that are plain C: the per-thread error
// text, result names, config defaults and the ABI version. The entry points
// that do work are the //export functions of main.go.
#include <string.h>

#include "fairgo.h"

// The text of the last error on this thread. A Go //export function runs on
// the calling C thread for its whole duration, so the Go side sets it for
// its caller's thread.
static __thread char fg_last_error_text[8192];

void fg_set_last_error(const char* msg, size_t n) {
	if (n >= sizeof fg_last_error_text) n = sizeof fg_last_error_text - 1;
	if (n > 0) memcpy(fg_last_error_text, msg, n);
	fg_last_error_text[n] = 0;
}

const char* fairgo_last_error(void) { return fg_last_error_text; }

int fairgo_abi_version(void) { return FAIRGO_ABI_VERSION; }

const char* fairgo_result_string(int result) {
	switch (result) {
	case FAIRGO_OK: return "FAIRGO_OK";
	case FAIRGO_NOT_READY: return "FAIRGO_NOT_READY";
	case FAIRGO_ERR_INVALID_ARGUMENT: return "FAIRGO_ERR_INVALID_ARGUMENT";
	case FAIRGO_ERR_BAD_HANDLE: return "FAIRGO_ERR_BAD_HANDLE";
	case FAIRGO_ERR_MISMATCH: return "FAIRGO_ERR_MISMATCH";
	case FAIRGO_ERR_TIMEOUT: return "FAIRGO_ERR_TIMEOUT";
	case FAIRGO_ERR_ABORTED: return "FAIRGO_ERR_ABORTED";
	case FAIRGO_ERR_CLOSED: return "FAIRGO_ERR_CLOSED";
	case FAIRGO_ERR_CUDA: return "FAIRGO_ERR_CUDA";
	case FAIRGO_ERR_NCCL: return "FAIRGO_ERR_NCCL";
	case FAIRGO_ERR_SYSTEM: return "FAIRGO_ERR_SYSTEM";
	case FAIRGO_ERR_INTERNAL: return "FAIRGO_ERR_INTERNAL";
	}
	return "FAIRGO_UNKNOWN_RESULT";
}

void fairgo_config_init(fairgo_config_t* cfg) {
	if (cfg == NULL) return;
	memset(cfg, 0, sizeof *cfg);
	cfg->struct_size = sizeof *cfg;
	cfg->device = -1;
	cfg->init_timeout_ms = 300000;
}
