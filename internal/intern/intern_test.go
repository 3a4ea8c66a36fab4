package intern

import (
	"strings"
	"testing"
	"unsafe"
)

// fresh is s in memory of its own, as a decoder would give it.
func fresh(s string) string { return strings.Clone(s) }

func TestStringShares(t *testing.T) {
	tab := New(10)
	a := tab.String(fresh("cpu-feature.node.kubevirt.io/avx2"))
	b := tab.String(fresh("cpu-feature.node.kubevirt.io/avx2"))
	if a != b || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("two interned copies of one string do not share memory")
	}
}

func TestAnyShares(t *testing.T) {
	tab := New(10)
	a, b := tab.Any(fresh("true")), tab.Any(fresh("true"))
	if a.(string) != "true" {
		t.Fatalf("Any(%q) = %v", "true", a)
	}
	// Interface values of a string point at a boxed string header: shared means one box.
	type iface struct{ typ, data unsafe.Pointer }
	if (*iface)(unsafe.Pointer(&a)).data != (*iface)(unsafe.Pointer(&b)).data {
		t.Fatalf("two boxes of one interned string")
	}
}

func TestStringsCopiesAndShares(t *testing.T) {
	tab := New(10)
	in := map[string]string{fresh("k"): fresh("true"), fresh("j"): fresh("true")}
	out := tab.Strings(in)
	if len(out) != 2 || out["k"] != "true" || out["j"] != "true" {
		t.Fatalf("Strings(%v) = %v", in, out)
	}
	if unsafe.StringData(out["k"]) != unsafe.StringData(out["j"]) {
		t.Fatalf("equal values not shared")
	}
	if tab.Strings(nil) != nil || tab.Strings(map[string]string{}) != nil {
		t.Fatalf("Strings of an empty map is not nil")
	}
}

// Past max entries the table starts over and still answers equal strings.
func TestStartsOver(t *testing.T) {
	tab := New(2)
	for _, s := range []string{"a", "b", "c", "d"} {
		if got := tab.String(fresh(s)); got != s {
			t.Fatalf("String(%q) = %q", s, got)
		}
		if got := tab.Any(fresh(s)); got != s {
			t.Fatalf("Any(%q) = %v", s, got)
		}
	}
	if len(tab.strs) > 2 || len(tab.boxes) > 2 {
		t.Fatalf("table holds %d strings, %d boxes, max 2", len(tab.strs), len(tab.boxes))
	}
}
