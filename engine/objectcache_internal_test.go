package engine

import (
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

func cacheVM(uid, rv, running string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "vm-" + uid},
		"spec":     map[string]any{"runStrategy": running},
	}}
	if uid != "" {
		u.SetUID(types.UID("uid-" + uid))
	}
	if rv != "" {
		u.SetResourceVersion(rv)
	}
	return u
}

func converted(t *testing.T, b *termBuilder, u *unstructured.Unstructured) *ast.Term {
	t.Helper()
	term, err := b.object(u)
	if err != nil {
		t.Fatal(err)
	}
	return term
}

func TestObjectCacheConvertsOnlyNewVersions(t *testing.T) {
	c := newObjectCache(10)
	first := converted(t, newTermBuilder(c), cacheVM("a", "1", "Always"))
	if again := converted(t, newTermBuilder(c), cacheVM("a", "1", "Always")); again != first {
		t.Errorf("the same version of the same object was converted again")
	}
	changed := converted(t, newTermBuilder(c), cacheVM("a", "2", "Halted"))
	if changed == first {
		t.Fatalf("a new resourceVersion was taken from the cache")
	}
	if got, _ := changed.Value.(ast.Object).Get(ast.StringTerm("spec")).Value.(ast.Object).Get(ast.StringTerm("runStrategy")).Value.(ast.String); got != "Halted" {
		t.Errorf("the new version decides as runStrategy %q, want Halted", got)
	}
	if s := (ObjectCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load()}); s != (ObjectCacheStats{Hits: 1, Misses: 2}) {
		t.Errorf("lookups %+v, want 1 hit and 2 misses", s)
	}
}

func TestObjectCacheKeepsNothingWithoutIdentity(t *testing.T) {
	c := newObjectCache(10)
	for _, u := range []*unstructured.Unstructured{cacheVM("", "1", "Always"), cacheVM("a", "", "Always")} {
		converted(t, newTermBuilder(c), u)
	}
	if n := len(c.cur) + len(c.prev); n != 0 {
		t.Errorf("%d objects kept without a UID or a resourceVersion (a manifest from a file), want none", n)
	}
}

func TestObjectCacheBoundedByTwoGenerations(t *testing.T) {
	c := newObjectCache(4)
	for i := range 100 {
		converted(t, newTermBuilder(c), cacheVM(fmt.Sprint(i), "1", "Always"))
		if n := len(c.cur) + len(c.prev); n > 8 {
			t.Fatalf("%d objects kept after %d, want at most 2×4", n, i+1)
		}
	}
	// The most recent stay: the last four are found, from the previous generation too.
	c.hits.Store(0)
	for i := 96; i < 100; i++ {
		converted(t, newTermBuilder(c), cacheVM(fmt.Sprint(i), "1", "Always"))
	}
	if h := c.hits.Load(); h != 4 {
		t.Errorf("%d of the last 4 objects found again, want 4", h)
	}
}

func TestNoObjectCacheByDefault(t *testing.T) {
	if c := newObjectCache(0); c != nil {
		t.Errorf("an object cache of 0 objects keeps some")
	}
}
