//go:build !fairgo_dl_generic

package dl

const fastPath = true
