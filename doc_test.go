package fairgo_test

import (
	"context"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"
)

// docFiles are the README and every page under doc/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("doc/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages, "the README links to pages under doc/")
	return append([]string{"README.md"}, pages...)
}

// block is a fenced code block of a markdown file.
type block struct {
	file, lang, text string
	line             int // of the opening fence
}

var fence = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```")

// blocks returns the fenced code blocks of file.
func blocks(t *testing.T, file string) []block {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	var out []block
	for _, m := range fence.FindAllSubmatchIndex(data, -1) {
		out = append(out, block{file: file, lang: string(data[m[2]:m[3]]), text: string(data[m[4]:m[5]]),
			line: 1 + strings.Count(string(data[:m[0]]), "\n")})
	}
	return out
}

// withoutCode is a markdown text with its fenced blocks and inline code
// blanked, so that links are looked for in prose only.
func withoutCode(md string) string {
	md = fence.ReplaceAllStringFunc(md, func(s string) string { return strings.Repeat("\n", strings.Count(s, "\n")) })
	return regexp.MustCompile("`[^`\n]*`").ReplaceAllString(md, "``")
}

// slug is GitHub's anchor of a heading: lower case, letters, digits,
// hyphens and underscores kept, spaces to hyphens, the rest dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the anchors of a markdown file's headings.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.*)$`).FindAllStringSubmatch(withoutCode(string(data)), -1) {
		out[slug(m[1])] = true
	}
	return out
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks: every relative link of the README and of doc/*.md names a
// file or directory of the repository, and a #fragment into a markdown
// file names one of its headings; every page under doc/ is linked from
// the README.
func TestDocLinks(t *testing.T) {
	linked := map[string]bool{}
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(string(data)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			rel, frag, _ := strings.Cut(target, "#")
			dest := file
			if rel != "" {
				dest = path.Join(path.Dir(file), rel)
				_, err := os.Stat(dest)
				require.NoError(t, err, "%s links to %s, which does not exist", file, target)
			}
			if file == "README.md" {
				linked[dest] = true
			}
			if frag != "" {
				require.True(
					t,
					strings.HasSuffix(dest, ".md"),
					"%s links to %s: a fragment of a file that is not markdown",
					file,
					target,
				)
				require.True(
					t,
					anchors(t, dest)[frag],
					"%s links to %s: %s has no heading with the anchor %q",
					file,
					target,
					dest,
					frag,
				)
			}
		}
	}
	for _, page := range docFiles(t)[1:] {
		require.True(t, linked[page], "the README does not link to %s", page)
	}
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"When fairgo wins, and when it only ties", "when-fairgo-wins-and-when-it-only-ties"},
		{"A first program", "a-first-program"},
		{"`fairrun` on 2 × 4", "fairrun-on-2--4"},
		{"Options", "options"},
	} {
		require.Equal(t, tc.want, slug(tc.heading), tc.heading)
	}
}

// TestReadmeFirstProgram: the README's first Go program is
// examples/minimal/main.go, character for character (its own test runs it
// and checks what it prints).
func TestReadmeFirstProgram(t *testing.T) {
	src, err := os.ReadFile("examples/minimal/main.go")
	require.NoError(t, err)
	for _, b := range blocks(t, "README.md") {
		if b.lang == "go" {
			require.Equal(
				t,
				string(src),
				b.text,
				"README.md:%d: the first Go block is examples/minimal/main.go",
				b.line,
			)
			require.LessOrEqual(t, strings.Count(b.text, "\n"), 45, "the first program stays short")
			return
		}
	}
	t.Fatal("README.md has no Go block")
}

// TestDocGoSnippetsCompile: every Go block of the README and doc/ compiles
// against this module (one without a package clause is a file of a
// package of its own).
func TestDocGoSnippetsCompile(t *testing.T) {
	var snippets []block
	for _, file := range docFiles(t) {
		for _, b := range blocks(t, file) {
			if b.lang == "go" {
				snippets = append(snippets, b)
			}
		}
	}
	require.GreaterOrEqual(t, len(snippets), 2, "the README's first program and the trainer's loop")
	if testing.Short() {
		t.Skip("-short: not compiling the snippets")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	// Inside the module, so that its packages are found; a directory
	// starting with _ is left out of ./... patterns.
	dir, err := os.MkdirTemp(".", "_snippets")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	var pkgs []string
	for i, b := range snippets {
		src := b.text
		if !regexp.MustCompile(`(?m)^package \w+`).MatchString(src) {
			src = "package snippet\n\n" + src
		}
		pkg := filepath.Join(dir, "s"+string(rune('a'+i)))
		require.NoError(t, os.Mkdir(pkg, 0o755))
		require.NoError(
			t,
			os.WriteFile(
				filepath.Join(pkg, "snippet.go"),
				[]byte("// "+b.file+":"+strconv.Itoa(b.line)+"\n"+src),
				0o644,
			),
		)
		pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, append([]string{"vet"}, pkgs...)...).CombinedOutput()
	require.NoError(t, err, "go vet of the doc's Go blocks:\n%s", out)
}

// TestDocPythonNames: every fairgo_torch.NAME of the README's and doc/'s
// Python blocks is defined by the package.
func TestDocPythonNames(t *testing.T) {
	srcs, err := filepath.Glob("python/fairgo_torch/*.py")
	require.NoError(t, err)
	require.NotEmpty(t, srcs)
	var pkg strings.Builder
	for _, f := range srcs {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		pkg.Write(data)
	}
	n := 0
	for _, file := range docFiles(t) {
		for _, b := range blocks(t, file) {
			if b.lang != "python" {
				continue
			}
			for _, m := range regexp.MustCompile(`fairgo_torch\.(\w+)`).FindAllStringSubmatch(b.text, -1) {
				n++
				def := regexp.MustCompile(
					`(?m)^(def|class) ` + m[1] + `\b|^` + m[1] + ` *=|\b` + m[1] + `\b.*# re-export|import .*\b` + m[1] + `\b`,
				)
				require.Regexp(
					t,
					def,
					pkg.String(),
					"%s:%d: fairgo_torch.%s is not defined by python/fairgo_torch",
					file,
					b.line,
					m[1],
				)
			}
		}
	}
	require.NotZero(t, n, "the hook's blocks name fairgo_torch's functions")
}

// TestDocCommands: in the README's and doc/'s sh blocks, every make target
// exists, every bin/NAME is a program or test binary make gpu-bin builds,
// and every path of the repository named (./examples/…, examples/…,
// scripts/…, python/…; not the user's ./train) exists.
func TestDocCommands(t *testing.T) {
	targets := makeTargets(t)
	mk, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	mains, err := filepath.Glob("*/*/main.go")
	require.NoError(t, err)
	more, err := filepath.Glob("*/*/*/main.go")
	require.NoError(t, err)
	programs := map[string]bool{}
	for _, m := range append(mains, more...) {
		programs[filepath.Base(filepath.Dir(m))] = true
	}
	repoPath := regexp.MustCompile(`(?:^|\s)(\./[\w./-]+|(?:examples|scripts|python|bench|cmd)/[\w./-]+)`)
	checked := 0
	for _, file := range docFiles(t) {
		for _, b := range blocks(t, file) {
			if b.lang != "sh" {
				continue
			}
			for _, line := range strings.Split(b.text, "\n") {
				cmd, _, _ := strings.Cut(line, "#")
				fields := strings.Fields(cmd)
				for i, f := range fields {
					switch {
					case f == "make" && i+1 < len(fields):
						for _, target := range strings.Split(fields[i+1], "&&") {
							if target != "" && !strings.Contains(target, "=") {
								require.True(t, targets[target], "%s:%d: make %s: no such target", file, b.line, target)
								checked++
							}
						}
					case strings.HasPrefix(f, "bin/"):
						name := strings.TrimPrefix(f, "bin/")
						ok := programs[name] ||
							(strings.HasSuffix(name, ".test") && strings.Contains(string(mk), "-o "+f+" "))
						require.True(t, ok, "%s:%d: %s is not built by make gpu-bin", file, b.line, f)
						checked++
					}
				}
				for _, m := range repoPath.FindAllStringSubmatch(cmd, -1) {
					p := strings.TrimSuffix(m[1], "/")
					if strings.ContainsAny(p, "*$") {
						continue
					}
					if first, _, _ := strings.Cut(strings.TrimPrefix(p, "./"), "/"); strings.HasPrefix(p, "./") &&
						!isDir(first) {
						continue // the user's own program (./train)
					}
					_, err := os.Stat(p)
					require.NoError(t, err, "%s:%d: %s does not exist", file, b.line, p)
					checked++
				}
			}
		}
	}
	require.Greater(t, checked, 20)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
