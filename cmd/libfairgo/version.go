//go:build cgo

package main

/*
#include <stdlib.h>
#include "fairgo.h"

typedef const char fg_cchar;
*/
import "C"

import (
	"sync"

	"github.com/fairgo/fairgo"
)

// versionText is fairgo.Version as a C string, made at the first call and
// kept for the life of the process: fairgo.h promises static storage.
var versionText = sync.OnceValue(func() *C.fg_cchar { return (*C.fg_cchar)(C.CString(fairgo.Version)) })

// fairgo_version returns the library's fairgo version, e.g. "0.1.0": the
// same as the Go module's and the fairgo_torch wheel's, so that a report
// from a C or Python caller names the fairgo it ran.
//
//export fairgo_version
func fairgo_version() *C.fg_cchar { return versionText() }
