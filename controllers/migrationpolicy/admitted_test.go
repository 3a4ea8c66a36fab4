package migrationpolicy

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

func policyObj(name, uid string, generation int64, team string) *unstructured.Unstructured {
	p := &unstructured.Unstructured{}
	p.SetName(name)
	p.SetUID(types.UID(uid))
	p.SetGeneration(generation)
	p.SetLabels(map[string]string{"team": team})
	return p
}

func teams(ps []*unstructured.Unstructured) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.GetName()+"="+p.GetLabels()["team"])
	}
	slices.Sort(out)
	return out
}

func TestAdmittedPoliciesMerge(t *testing.T) {
	clock := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	var a admittedPolicies
	a.now = func() time.Time { return clock }

	cached := []*unstructured.Unstructured{policyObj("a", "ua", 1, "old"), policyObj("b", "ub", 1, "b")}
	if got := teams(a.merge(cached, "k")); !slices.Equal(got, []string{"a=old", "b=b"}) {
		t.Fatalf("nothing admitted: got %v", got)
	}

	// A create the cache does not show yet, and an update of a whose new spec it does not show.
	a.remember(policyObj("c", "uc", 1, "c"), "k")
	a.remember(policyObj("a", "ua", 2, "new"), "k")
	if got := teams(a.merge(cached, "k")); !slices.Equal(got, []string{"a=new", "b=b", "c=c"}) {
		t.Fatalf("admitted, cache behind: got %v", got)
	}

	// The cache catches up with c and a: they are forgotten, the cached versions count.
	caughtUp := []*unstructured.Unstructured{policyObj("a", "ua", 2, "new-cached"), cached[1], policyObj("c", "uc", 1, "c-cached")}
	if got := teams(a.merge(caughtUp, "k")); !slices.Equal(got, []string{"a=new-cached", "b=b", "c=c-cached"}) {
		t.Fatalf("cache caught up: got %v", got)
	}
	if len(a.byName) != 0 {
		t.Fatalf("want every admitted policy forgotten once cached, still have %d", len(a.byName))
	}

	// A policy of the same name but another UID (deleted and created again) is not the one
	// admitted: the admitted one counts until the cache shows it or it expires.
	a.remember(policyObj("d", "ud2", 1, "d2"), "k")
	stale := append(slices.Clone(cached), policyObj("d", "ud1", 5, "d1"))
	if got := teams(a.merge(stale, "k")); !slices.Equal(got, []string{"a=old", "b=b", "d=d2"}) {
		t.Fatalf("other UID cached: got %v", got)
	}

	// Admitted under another key (an update of b that changed its selectors, and a new e):
	// neither is compared under k, and b's cached version no longer counts there either.
	a.remember(policyObj("b", "ub", 2, "b-moved"), "other")
	a.remember(policyObj("e", "ue", 1, "e"), "other")
	if got := teams(a.merge(cached, "k")); !slices.Equal(got, []string{"a=old", "d=d2"}) {
		t.Fatalf("admitted under another key, seen from k: got %v", got)
	}
	if got := teams(a.merge(nil, "other")); !slices.Equal(got, []string{"b=b-moved", "e=e"}) {
		t.Fatalf("admitted under another key, seen from it: got %v", got)
	}

	// Admitted but never stored (refused later in the chain): it expires.
	clock = clock.Add(admittedTTL + time.Second)
	if got := teams(a.merge(cached, "k")); !slices.Equal(got, []string{"a=old", "b=b"}) {
		t.Fatalf("expired: got %v", got)
	}
	// Those of the other key go at the next admission's sweep.
	a.remember(policyObj("f", "uf", 1, "f"), "k")
	if len(a.byName) != 1 || len(a.byKey) != 1 {
		t.Fatalf("want expired policies forgotten, still have %d names under %d keys", len(a.byName), len(a.byKey))
	}
}
