package fairgo

// Version is fairgo's semantic version: the module's, the programs'
// (--version), the C ABI's (fairgo_version) and the fairgo_torch wheel's
// (python/fairgo_torch/_version.py, which a test keeps equal to it). One
// number for all of them, so that a bug report names every part at once.
// CHANGELOG.md says what each version changed.
const Version = "0.1.0"
