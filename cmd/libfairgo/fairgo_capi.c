// The parts of libfairgo's C ABI that are plain C: the per-thread error
// text, result names, config defaults and the ABI version. The entry points
// that do work are the //export functions of main.go.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fairgo.h"

// The text of the last error on each thread, in a heap buffer reached
// through a pthread key (not a __thread array: a Go c-shared library is
// loaded with static TLS, which has little room). A Go //export function
// runs on the calling C thread for its whole duration, so the Go side sets
// the text for its caller's thread.
enum { FG_ERR_CAP = 8192 };
static pthread_key_t fg_err_key;
static pthread_once_t fg_err_once = PTHREAD_ONCE_INIT;
static int fg_err_key_ok;

static void fg_err_key_make(void) { fg_err_key_ok = pthread_key_create(&fg_err_key, free) == 0; }

void fg_set_last_error(const char* msg, size_t n) {
	pthread_once(&fg_err_once, fg_err_key_make);
	if (!fg_err_key_ok) return;
	char* buf = pthread_getspecific(fg_err_key);
	if (buf == NULL) {
		buf = malloc(FG_ERR_CAP);
		if (buf == NULL || pthread_setspecific(fg_err_key, buf) != 0) {
			free(buf);
			return;
		}
	}
	if (n >= FG_ERR_CAP) n = FG_ERR_CAP - 1;
	if (n > 0) memcpy(buf, msg, n);
	buf[n] = 0;
}

const char* fairgo_last_error(void) {
	pthread_once(&fg_err_once, fg_err_key_make);
	const char* buf = fg_err_key_ok ? pthread_getspecific(fg_err_key) : NULL;
	return buf ? buf : "";
}

extern char** environ;

// The i-th entry of the C environment ("NAME=value"); NULL is its end (the
// caller stops there).
const char* fg_environ(size_t i) { return environ == NULL ? NULL : environ[i]; }

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
	case FAIRGO_ERR_NO_DEVICE: return "FAIRGO_ERR_NO_DEVICE";
	}
	return "FAIRGO_UNKNOWN_RESULT";
}

void fairgo_config_init(fairgo_config_t* cfg) {
	if (cfg == NULL) return;
	memset(cfg, 0, sizeof *cfg);
	cfg->struct_size = sizeof *cfg;
	cfg->device = -1;
	cfg->init_timeout_ms = 300000;
	cfg->algorithm = FAIRGO_ALGORITHM_AUTO;
}
