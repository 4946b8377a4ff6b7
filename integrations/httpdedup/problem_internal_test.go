package httpdedup

import (
	"os"
	"strings"
	"testing"
)

// TestProblemTypesHaveEntries: every problem type the middleware sends
// has its own heading in docs/idempotency.md, the page
// DefaultProblemBase points at, so each type URI resolves to its entry
// (GitHub's anchor of a heading is its text, lowercased, spaces as
// hyphens); and no heading names a type that is never sent.
func TestProblemTypesHaveEntries(t *testing.T) {
	b, err := os.ReadFile("../../docs/idempotency.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n## Problem types\n")
	section, _, _ = strings.Cut(section, "\n## ")
	headings := map[string]bool{}
	for _, l := range strings.Split(section, "\n") {
		if h, ok := strings.CutPrefix(l, "### "); ok {
			headings[h] = true
		}
	}
	titles := []string{titleMissing, titleMalformed, titleTooLarge, titleScope, titleFingerprint, titleConflict, titleInFlight, titleUnknown, titleDamaged, titleUnavailable, titlePanic}
	for _, title := range titles {
		if !headings[slug(title)] {
			t.Errorf("problem %q (type …#%s) has no heading in docs/idempotency.md's Problem types", title, slug(title))
		}
		delete(headings, slug(title))
	}
	for h := range headings {
		t.Errorf("docs/idempotency.md names problem type %q, which the middleware never sends", h)
	}
	if !strings.HasPrefix(DefaultProblemBase, "https://github.com/tierdedup/tierdedup/blob/main/docs/idempotency.md#") {
		t.Errorf("DefaultProblemBase %q is not the page checked here", DefaultProblemBase)
	}
}
