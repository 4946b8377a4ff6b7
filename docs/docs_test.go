// Package docs holds no code: its test keeps the repository's documentation
// honest. It fails on a dangling reference (a relative Markdown link, an
// anchor, a repository path quoted in the docs, or a file named in a Go
// comment that does not exist) and on a README longer than readmeMaxLines.
package docs

import (
	"bufio"
	"fmt"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds README.md: it is the page a new user reads first;
// everything else lives under docs/.
const readmeMaxLines = 250

// module is the module path: a Go comment or a code span that names one of
// the module's packages by import path names a directory of the repository.
const module = "github.com/tierdedup/tierdedup/"

// root returns the repository root: the parent of this package's directory.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("repository root %s has no go.mod: %v", r, err)
	}
	return r
}

// markdownFiles returns README.md and docs/*.md, relative to the root.
func markdownFiles(t *testing.T, r string) []string {
	t.Helper()
	files := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(r, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, _ := filepath.Rel(r, d)
		files = append(files, filepath.ToSlash(rel))
	}
	sort.Strings(files[1:])
	return files
}

func TestReadmeLength(t *testing.T) {
	r := root(t)
	lines := len(readLines(t, filepath.Join(r, "README.md")))
	if lines > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: move the detail under docs/", lines, readmeMaxLines)
	}
}

// mdDoc is a Markdown file split into what the checks need.
type mdDoc struct {
	links   []mdRef // [text](target) and [label]: target, outside code
	spans   []mdRef // `inline code`, outside fenced blocks
	anchors map[string]bool
}

// mdRef is a reference and the line it is on.
type mdRef struct {
	line   int
	target string
}

var (
	inlineLink   = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLinkDef   = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	codeSpan     = regexp.MustCompile("`+[^`]*`+")
	heading      = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	schemePrefix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

func parseMarkdown(t *testing.T, path string) mdDoc {
	t.Helper()
	d := mdDoc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range readLines(t, path) {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			slug := slugify(m[1])
			if k := seen[slug]; k > 0 {
				d.anchors[fmt.Sprintf("%s-%d", slug, k)] = true
			} else {
				d.anchors[slug] = true
			}
			seen[slug]++
		}
		for _, s := range codeSpan.FindAllString(line, -1) {
			d.spans = append(d.spans, mdRef{n, strings.Trim(s, "` ")})
		}
		text := codeSpan.ReplaceAllString(line, "``")
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			d.links = append(d.links, mdRef{n, m[1]})
		}
		if m := refLinkDef.FindStringSubmatch(text); m != nil {
			d.links = append(d.links, mdRef{n, m[1]})
		}
	}
	return d
}

// slugify is GitHub's heading anchor: lower case, punctuation dropped
// (hyphens and underscores kept), spaces turned into hyphens.
func slugify(h string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(h) {
		switch {
		case c == ' ':
			b.WriteRune('-')
		case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsNumber(c):
			b.WriteRune(c)
		}
	}
	return b.String()
}

func TestMarkdownLinks(t *testing.T) {
	r := root(t)
	docs := map[string]mdDoc{}
	files := markdownFiles(t, r)
	for _, f := range files {
		docs[f] = parseMarkdown(t, filepath.Join(r, f))
	}
	anchorsOf := func(rel string) (map[string]bool, bool) {
		if d, ok := docs[rel]; ok {
			return d.anchors, true
		}
		if !strings.HasSuffix(rel, ".md") {
			return nil, false
		}
		d := parseMarkdown(t, filepath.Join(r, filepath.FromSlash(rel)))
		docs[rel] = d
		return d.anchors, true
	}
	for _, f := range files {
		for _, l := range docs[f].links {
			target := l.target
			if schemePrefix.MatchString(target) || strings.HasPrefix(target, "//") {
				continue // a URL: not this repository's to check
			}
			path, frag, _ := strings.Cut(target, "#")
			rel := f
			if path != "" {
				var ok bool
				rel, ok = inRepo(r, filepath.Dir(filepath.Join(r, f)), path)
				if !ok {
					t.Errorf("%s:%d: link %q leaves the repository", f, l.line, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(r, filepath.FromSlash(rel))); err != nil {
					t.Errorf("%s:%d: link %q: no such file or directory %s", f, l.line, target, rel)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if anchors, ok := anchorsOf(rel); ok && !anchors[strings.ToLower(frag)] {
				t.Errorf("%s:%d: link %q: %s has no heading #%s", f, l.line, target, rel, frag)
			}
		}
	}
}

// TestMarkdownPaths checks the repository paths the docs quote as code
// (`engine/doc.go`, `tier/redis/redistest`, an import path of the module):
// each must exist, so a moved file cannot leave its old name in the docs.
func TestMarkdownPaths(t *testing.T) {
	r := root(t)
	tops := topLevel(t, r)
	for _, f := range markdownFiles(t, r) {
		for _, s := range parseMarkdown(t, filepath.Join(r, f)).spans {
			p, ok := repoPath(s.target, tops)
			if !ok {
				continue
			}
			if _, err := os.Stat(filepath.Join(r, filepath.FromSlash(p))); err != nil {
				t.Errorf("%s:%d: `%s` names %s, which does not exist", f, s.line, s.target, p)
			}
		}
	}
}

// TestEveryDocIsLinked checks that README.md links every page under docs/:
// a page nobody can reach from the front page is as good as lost.
func TestEveryDocIsLinked(t *testing.T) {
	r := root(t)
	linked := map[string]bool{}
	for _, l := range parseMarkdown(t, filepath.Join(r, "README.md")).links {
		path, _, _ := strings.Cut(l.target, "#")
		if rel, ok := inRepo(r, r, path); ok {
			linked[rel] = true
		}
	}
	for _, f := range markdownFiles(t, r)[1:] {
		if !linked[f] {
			t.Errorf("README.md does not link %s", f)
		}
	}
}

// TestGoCommentReferences walks every .go file of the repository and checks
// the files its comments name: a Markdown file (a name ending in .md, as
// in "see docs/reliability.md"), or a repository path ("tier/pebble",
// "engine/doc.go", an import path of the module). Each must exist, relative
// to the repository root or to the commenting file's directory.
func TestGoCommentReferences(t *testing.T) {
	r := root(t)
	tops := topLevel(t, r)
	checked := 0
	err := filepath.WalkDir(r, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != r && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(r, path)
		rel = filepath.ToSlash(rel)
		for _, c := range comments(src) {
			for _, ref := range commentRefs(c.text, tops) {
				checked++
				if !existsFrom(r, filepath.Dir(path), ref) {
					t.Errorf("%s:%d: comment names %q, which does not exist", rel, c.line, ref)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d references in Go comments checked", checked)
}

// goComment is one comment of a Go file and the line it starts on.
type goComment struct {
	line int
	text string
}

// comments returns the comments of a Go source file. The scanner reads
// tokens only, so a file that does not parse (one being edited) still
// yields its comments.
func comments(src []byte) []goComment {
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	s.Init(file, src, func(token.Position, string) {}, scanner.ScanComments)
	var out []goComment
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok == token.COMMENT {
			out = append(out, goComment{fset.Position(pos).Line, lit})
		}
	}
}

// commentRefs returns the file references in a comment's text.
func commentRefs(text string, tops map[string]bool) []string {
	var refs []string
	for _, word := range strings.Fields(text) {
		if strings.Contains(word, "://") {
			continue // a URL
		}
		w := trimWord(word)
		if w == "" {
			continue
		}
		if p, ok := repoPath(w, tops); ok {
			refs = append(refs, p)
			continue
		}
		if strings.HasSuffix(strings.ToLower(w), ".md") && len(w) > len(".md") {
			refs = append(refs, w)
		}
	}
	return refs
}

// pathRun ends a word at the first character no path here contains, so
// "tier/pebble's" is tier/pebble and "(see docs/reliability.md)." is
// docs/reliability.md.
var pathRun = regexp.MustCompile(`[A-Za-z0-9_./-]+`)

func trimWord(w string) string {
	m := pathRun.FindString(w)
	return strings.TrimRight(strings.TrimLeft(m, "."), ".")
}

// repoPath reports whether s names a path in the repository: it starts with
// one of the repository's top-level directories and a slash (or with the
// module path), and holds no placeholder.
func repoPath(s string, tops map[string]bool) (string, bool) {
	s = strings.TrimPrefix(s, "./")
	if rest, ok := strings.CutPrefix(s, module); ok {
		s = rest
	}
	top, rest, ok := strings.Cut(s, "/")
	if !ok || !tops[top] || strings.ContainsAny(s, "<>*{}$ ") || strings.Contains(rest, "...") {
		return "", false
	}
	s = strings.TrimRight(s, "/.,:;")
	// A Go selector after a package path ("tier/redis.NewBackend") names
	// the package's directory.
	if i := strings.LastIndexByte(s, '.'); i > strings.LastIndexByte(s, '/') && i+1 < len(s) && unicode.IsUpper(rune(s[i+1])) {
		s = s[:i]
	}
	return s, true
}

// topLevel returns the repository's top-level directories.
func topLevel(t *testing.T, r string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(r)
	if err != nil {
		t.Fatal(err)
	}
	tops := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" {
			tops[e.Name()] = true
		}
	}
	return tops
}

// inRepo resolves a link target from dir and returns it relative to the
// root, or false when it leaves the repository.
func inRepo(r, dir, target string) (string, bool) {
	p := filepath.Join(dir, filepath.FromSlash(target))
	if strings.HasPrefix(target, "/") {
		p = filepath.Join(r, filepath.FromSlash(target))
	}
	rel, err := filepath.Rel(r, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}

// existsFrom reports whether ref names a file or directory relative to the
// repository root or to dir.
func existsFrom(r, dir, ref string) bool {
	for _, base := range []string{r, dir} {
		if _, err := os.Stat(filepath.Join(base, filepath.FromSlash(ref))); err == nil {
			return true
		}
	}
	return false
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
