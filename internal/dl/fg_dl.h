/*
 * fg_dl.h: the dlopen, dlsym, dlclose and dladdr helpers that the cgo
 * preambles of packages cuda and nccl share (each includes it through
 * `#cgo CFLAGS: -I${SRCDIR}/../internal/dl`). Static functions only: each
 * package compiles its own copy. The symbol names stay in each package's
 * table; fg_dl_sym takes the name.
 *
 * dladdr needs _GNU_SOURCE, defined before the first #include of the
 * preamble; fg_dlopen takes cgo's _GoString_, so this header is for cgo
 * preambles only.
 */
#ifndef FG_DL_H
#define FG_DL_H

#ifndef _GNU_SOURCE
#error "fg_dl.h: define _GNU_SOURCE before any #include (dladdr needs it)"
#endif

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// dlopen and dlerror in one call, so that the error text comes from the same
// thread. path is a Go string (cgo's _GoString_), copied to add the NUL.
static void* fg_dlopen(_GoString_ path, char* err, size_t n) {
	size_t len = _GoStringLen(path);
	char* p = malloc(len + 1);
	if (!p) {
		snprintf(err, n, "%s", "out of memory");
		return NULL;
	}
	if (len > 0) memcpy(p, _GoStringPtr(path), len);
	p[len] = 0;
	dlerror();
	void* h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
	free(p);
	if (!h) {
		const char* e = dlerror();
		snprintf(err, n, "%s", e ? e : "dlopen failed");
	}
	return h;
}

// dlsym of name, with the loader's text in err when it is missing.
static void* fg_dl_sym(void* h, const char* name, char* err, size_t n) {
	dlerror();
	void* p = dlsym(h, name);
	if (!p) {
		const char* e = dlerror();
		snprintf(err, n, "%s", e ? e : "symbol not found");
	}
	return p;
}

static int fg_dlclose(void* h) { return dlclose(h); }

// dladdr tells which file a resolved symbol came from (the real path of a
// library found through the loader's search); -1 for NULL or an unknown one.
static int fg_origin(void* sym, char* out, size_t n) {
	Dl_info info;
	if (sym == NULL || dladdr(sym, &info) == 0 || info.dli_fname == NULL) return -1;
	snprintf(out, n, "%s", info.dli_fname);
	return 0;
}

#endif
