package fairgo_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The import rules doc/architecture.md states, checked on the packages of
// this module as `go list` sees them (library code, not tests).

const module = "github.com/fairgo/fairgo"

type listedPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
	CgoFiles   []string
}

// listPackages runs `go list -json` over the module's packages.
func listPackages(t *testing.T) map[string]listedPackage {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]listedPackage{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs[strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")] = p
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

// rel is a module path relative to the module ("" for the root).
func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// under reports whether the package at r is dir or below it.
func under(r, dir string) bool { return r == dir || strings.HasPrefix(r, dir+"/") }

// library reports whether r is library code: not a command, an example,
// the benchmark harness or internal/.
func library(r string) bool {
	for _, dir := range []string{"cmd", "examples", "bench", "internal"} {
		if under(r, dir) {
			return false
		}
	}
	return !strings.Contains(r, "/internal/")
}

func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	ownDeps := func(p listedPackage) []string {
		var out []string
		for _, d := range p.Deps {
			if r, ok := rel(d); ok {
				out = append(out, r)
			}
		}
		return out
	}
	cgo := []string{"cmd/libfairgo"}
	for r, p := range pkgs {
		// cgo lives in the C ABI only: the GPU backend calls the driver
		// and NCCL through internal/dl, so everything else builds with
		// CGO_ENABLED=0.
		if len(p.CgoFiles) > 0 && !slices.Contains(cgo, r) {
			t.Errorf("%s has cgo files %v: cgo lives only in %v", r, p.CgoFiles, cgo)
		}
		for _, d := range ownDeps(p) {
			// No package depends on a command's packages but the command's own.
			if under(d, "cmd") {
				parts := strings.SplitN(d, "/", 3)
				if !under(r, parts[0]+"/"+parts[1]) {
					t.Errorf("%s depends on %s: nothing outside a command imports its packages", r, d)
				}
			}
			// Library packages and internal/'s leaves do not depend on the
			// rank harness.
			if under(d, "internal/harness") && (library(r) || (under(r, "internal") && !under(r, "internal/harness"))) {
				t.Errorf("%s depends on %s: only programs, bench and tests use the harness", r, d)
			}
			// Library packages depend on no program, example or benchmark.
			if library(r) && (under(d, "examples") || under(d, "bench")) {
				t.Errorf("%s depends on %s", r, d)
			}
		}
	}
	// The engine knows no backend and no setup: hier and what it imports.
	// Of internal/ it may use the leaves that pace polls, share host memory
	// and read elements, which import nothing of the module but its root.
	engineLeaves := []string{"internal/poll", "internal/shm", "internal/elem"}
	for _, r := range []string{"hier", "streams", "staging", "padding", ""} {
		for _, d := range ownDeps(pkgs[r]) {
			for _, bad := range []string{"cuda", "nccl", "sim", "hier/setup", "rendezvous", "topology", "cmd", "internal"} {
				if under(d, bad) && !slices.Contains(engineLeaves, d) {
					t.Errorf("%q depends on %s: the engine and its layers import no backend, setup or launcher", r, d)
				}
			}
		}
	}
	for _, r := range engineLeaves {
		deps := slices.DeleteFunc(ownDeps(pkgs[r]), func(d string) bool { return d == "" })
		if len(deps) > 0 {
			t.Errorf("%s depends on %v: the engine's leaves import nothing of the module but its root", r, deps)
		}
	}
	// Down the picture: the layers under hier do not import it.
	for _, r := range []string{"", "backend", "streams", "staging", "padding", "internal/elem"} {
		if slices.Contains(ownDeps(pkgs[r]), "hier") {
			t.Errorf("%q depends on hier", r)
		}
	}
	// The backend contract sits under the engine and the backends alike:
	// it imports the root package and streams only, and the backends reach
	// setup's world through it, never through hier/setup.
	for _, d := range ownDeps(pkgs["backend"]) {
		if d != "" && d != "streams" {
			t.Errorf("backend depends on %s: the contract imports only the root package and streams", d)
		}
	}
	for _, r := range []string{"cuda", "sim", "nccl"} {
		if slices.Contains(ownDeps(pkgs[r]), "hier/setup") {
			t.Errorf("%s depends on hier/setup: backends implement backend.Backend", r)
		}
	}
	for _, d := range pkgs["hier"].Deps {
		if strings.HasPrefix(d, "github.com/NVIDIA/go-nvml") {
			t.Errorf("hier depends on %s", d)
		}
	}
}
