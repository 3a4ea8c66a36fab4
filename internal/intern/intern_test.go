package intern

import (
	"reflect"
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

// JSON copies a decoded value field for field, sharing keys and short strings, and leaves
// long strings and other scalars as they are.
func TestJSONCopiesAndShares(t *testing.T) {
	tab := New(100)
	long := fresh("a message longer than the limit")
	decoded := func() map[string]any {
		return map[string]any{
			fresh("status"): map[string]any{
				fresh("phase"):      fresh("Running"),
				fresh("conditions"): []any{map[string]any{fresh("type"): fresh("Ready"), fresh("status"): fresh("True")}},
				fresh("message"):    long,
				fresh("ready"):      true,
				fresh("count"):      int64(3),
				fresh("none"):       nil,
			},
		}
	}
	a, b := decoded(), decoded()
	short := func(_, v string) bool { return len(v) <= 10 }
	ca, cb := tab.JSON(a, short).(map[string]any), tab.JSON(b, short).(map[string]any)
	if !reflect.DeepEqual(ca, a) || !reflect.DeepEqual(cb, b) {
		t.Fatalf("JSON changed the content: %v", ca)
	}
	sa, sb := ca["status"].(map[string]any), cb["status"].(map[string]any)
	type iface struct{ typ, data unsafe.Pointer }
	box := func(v any) unsafe.Pointer { return (*iface)(unsafe.Pointer(&v)).data }
	if box(sa["phase"]) != box(sb["phase"]) {
		t.Errorf("short strings not shared")
	}
	if reflect.ValueOf(sa).Pointer() == reflect.ValueOf(a["status"]).Pointer() {
		t.Errorf("a map of the input reused, not copied")
	}
	for k := range sa {
		if k == "phase" {
			for k2 := range sb {
				if k2 == "phase" && unsafe.StringData(k) != unsafe.StringData(k2) {
					t.Errorf("keys not shared")
				}
			}
		}
	}
	if _, ok := tab.boxes[long]; ok {
		t.Errorf("a string share refused interned")
	}
}
