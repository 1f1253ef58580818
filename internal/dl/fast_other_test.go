//go:build !amd64 || fairgo_dl_generic

package dl

const fastPath = false
