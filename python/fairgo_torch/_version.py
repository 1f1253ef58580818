"""fairgo_torch's version: fairgo's (fairgo.Version in the Go module's
version.go, FAIRGO_VERSION of fairgo.h). The wheel takes its version from
here (python/build_wheel.py), and a Go test (version_test.go) fails when
this, pyproject.toml and fairgo.Version differ."""

__version__ = "0.1.0"
