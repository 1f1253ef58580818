/*
 * dlopen, dlsym, dlerror and dlclose for Go code that takes their address
 * itself (purego's //go:linkname dlopen dlopen): a reference from a Go
 * object is unversioned, so the linker would bind it to glibc's newest
 * version (dlopen@GLIBC_2.34 on glibc 2.34 and newer), which
 * glibc_compat.h cannot reach. These hidden local definitions satisfy such
 * references inside libfairgo.so and jump to the GLIBC_2.2.5 versions (in
 * libdl.so.2 before glibc 2.34), leaving the return address, which dlopen
 * and dlsym read for the caller's object, as it was.
 *
 * Only with the flags of `make libfairgo` (FAIRGO_GLIBC_COMPAT, with
 * glibc_compat.h): a plain go build of the package leaves these functions
 * to glibc.
 */
#if defined(FAIRGO_GLIBC_COMPAT) && defined(__linux__) && defined(__x86_64__)

#define FG_DL(name) \
	.symver fg_glibc_##name, name@GLIBC_2.2.5; \
	.globl name; .hidden name; .type name, @function; \
name:	jmp fg_glibc_##name@PLT; \
	.size name, .-name;

	.text
FG_DL(dlopen)
FG_DL(dlsym)
FG_DL(dlerror)
FG_DL(dlclose)

#endif

	.section .note.GNU-stack,"",@progbits
