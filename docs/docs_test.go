// Package docs_test checks the README and the pages of docs/ against the
// tree they describe: every relative link reaches a file (and its #anchor a
// heading of that file), every `make X` is a target of the Makefile, and
// the configuration reference names every configuration key and no other.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/config"
)

// pages returns the Markdown files the checks read, relative to the
// repository's root: README.md and docs/*.md.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		out = append(out, filepath.Join("docs", d))
	}
	return out
}

func read(t *testing.T, rootRel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", rootRel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	fenceRE   = regexp.MustCompile("(?s)```.*?```")
)

// anchor is GitHub's anchor of a heading: lower case, punctuation dropped,
// spaces as hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(text string) []string {
	var out []string
	for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(text, ""), -1) {
		out = append(out, anchor(strings.ReplaceAll(m[1], "`", "")))
	}
	return out
}

func TestLinksResolve(t *testing.T) {
	for _, page := range pages(t) {
		text := fenceRE.ReplaceAllString(read(t, page), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			rel := page
			if file != "" {
				rel = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(filepath.Join("..", rel)); err != nil {
					t.Errorf("%s: link %q: %s does not exist", page, target, rel)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(rel, ".md") && !slices.Contains(anchors(read(t, rel)), frag) {
				t.Errorf("%s: link %q: %s has no heading #%s (it has %v)", page, target, rel, frag, anchors(read(t, rel)))
			}
		}
	}
}

func TestMakeTargetsExist(t *testing.T) {
	makefile := read(t, "Makefile")
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(makefile, -1) {
		targets[m[1]] = true
	}
	if len(targets) < 5 {
		t.Fatalf("read %d targets from the Makefile: the pattern no longer matches it", len(targets))
	}
	cmdRE := regexp.MustCompile(`\bmake ((?:[a-z][a-z0-9-]* ?)+)`)
	for _, page := range pages(t) {
		for _, m := range cmdRE.FindAllStringSubmatch(read(t, page), -1) {
			for _, target := range strings.Fields(m[1]) {
				if strings.ToUpper(target[:1]) == target[:1] || strings.Contains(target, "=") {
					break // a variable, e.g. make bench-sustained PREFILL=0
				}
				if !targets[target] {
					if target == "sure" || target == "it" || target == "the" || target == "a" {
						break // prose: "make sure", "make it"
					}
					t.Errorf("%s: `make %s`: the Makefile has no target %q", page, m[1], target)
				}
			}
		}
	}
}

func TestConfigurationReferenceNamesEveryKey(t *testing.T) {
	doc := read(t, "docs/configuration.md") + read(t, "config.example.yaml")
	for _, key := range config.Keys() {
		if !strings.Contains(doc, key) && !strings.Contains(doc, key[strings.LastIndex(key, ".")+1:]+":") {
			t.Errorf("config key %s is neither in docs/configuration.md nor in config.example.yaml", key)
		}
	}
	// Every key the reference's table names is a key.
	known := map[string]bool{}
	for _, k := range config.Keys() {
		known[k] = true
	}
	keyRE := regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+)+)`")
	for _, line := range strings.Split(read(t, "docs/configuration.md"), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.Split(line, "|")[1]
		for _, m := range keyRE.FindAllStringSubmatch(cell, -1) {
			if !known[m[1]] && !hasPrefixKey(known, m[1]) {
				t.Errorf("docs/configuration.md names %s, which is no configuration key", m[1])
			}
		}
	}
}

// hasPrefixKey reports whether some key starts with prefix + ".": the table
// may name a group (kafka.tls) for its keys.
func hasPrefixKey(known map[string]bool, prefix string) bool {
	for k := range known {
		if strings.HasPrefix(k, prefix+".") {
			return true
		}
	}
	return false
}
