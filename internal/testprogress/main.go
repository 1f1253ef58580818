// Command testprogress runs go test -json with the arguments it is given
// and prints, as they end, each package's result (as go test does) and each
// top-level test that took a while, so that a long package is not silent
// until it ends. A failing test's output and a failing package's are
// printed in full. It exits with go test's status. `make test` runs it:
//
//	go run ./internal/testprogress go -race ./...
//
// The first argument is the go command, the rest go to go test.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// slow is how long a passing top-level test runs before it gets a line.
const slow = 2 * time.Second

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Elapsed    float64
	Output     string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testprogress GO [go test arguments]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], append([]string{"test", "-json"}, os.Args[2:]...)...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	}
	start := time.Now()
	report(out, os.Stdout, start)
	err = cmd.Wait()
	fmt.Printf("# go test: %s in %s\n", status(err), time.Since(start).Round(time.Second))
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		os.Exit(2)
	}
}

func status(err error) string {
	if err != nil {
		return "FAIL (" + err.Error() + ")"
	}
	return "ok"
}

// report reads go test's events from r and writes the progress lines to w.
func report(r io.Reader, w io.Writer, start time.Time) {
	logs := map[string][]string{} // output so far, by package and test ("" for the package's own)
	key := func(e event) string { return e.Package + "\x00" + e.Test }
	at := func() string { return fmt.Sprintf("%4ds", int(time.Since(start).Seconds())) }
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(w, sc.Text()) // not an event: pass it on
			continue
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "output":
			logs[key(e)] = append(logs[key(e)], e.Output)
		case "pass", "fail", "skip":
			k := key(e)
			if e.Test == "" { // the package
				switch {
				case e.Action == "fail":
					fmt.Fprintf(w, "%s FAIL %s (%.1fs)\n", at(), e.Package, e.Elapsed)
					fmt.Fprint(w, strings.Join(logs[k], ""))
				case e.Action == "skip":
				default:
					fmt.Fprintf(w, "%s ok   %s %.1fs\n", at(), e.Package, e.Elapsed)
				}
				for l := range logs {
					if strings.HasPrefix(l, e.Package+"\x00") {
						delete(logs, l)
					}
				}
				continue
			}
			top := !strings.Contains(e.Test, "/")
			switch {
			case e.Action == "fail":
				fmt.Fprintf(w, "%s --- FAIL %s %s (%.1fs)\n", at(), e.Package, e.Test, e.Elapsed)
				fmt.Fprint(w, strings.Join(logs[k], ""))
			case top && time.Duration(e.Elapsed*float64(time.Second)) >= slow:
				fmt.Fprintf(w, "%s      %s %s %.1fs\n", at(), e.Package, e.Test, e.Elapsed)
			}
			delete(logs, k)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(w, "testprogress: reading go test's output:", err)
	}
}
