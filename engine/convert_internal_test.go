package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTermBuilderGivesInterfaceToValuesValues: the pool input's converter gives the value
// ast.InterfaceToValue gives, for every JSON type as unstructured objects hold them (int64,
// float64, json.Number, nested lists and maps), across its blocks of terms (arrays longer than
// a block, many objects), and for objects sharing keys, strings and small objects of scalars.
func TestTermBuilderGivesInterfaceToValuesValues(t *testing.T) {
	long := make([]any, termBlock+7)
	for i := range long {
		long[i] = map[string]any{"i": int64(i), "name": fmt.Sprintf("vm-%d", i%3)}
	}
	objs := []*unstructured.Unstructured{
		{Object: map[string]any{
			"metadata": map[string]any{"name": "a", "labels": map[string]any{"x": "1"}},
			"spec": map[string]any{
				"int": int64(3), "float": 1.5, "number": json.Number("12345678901234567890"),
				"bool": true, "null": nil, "empty": map[string]any{}, "none": []any{},
				"nested": []any{[]any{"a", int64(1)}, map[string]any{"b": []any{false}}},
			},
		}},
		{Object: map[string]any{"metadata": map[string]any{"name": "b"}, "items": long}},
		nil,
		// Small objects of scalars are shared by content: none of these is another's.
		{Object: map[string]any{"leaves": []any{
			map[string]any{"x": "1"}, map[string]any{"x": int64(1)}, map[string]any{"x": 1.0},
			map[string]any{"x": true}, map[string]any{"x": "true"}, map[string]any{"x": nil},
			map[string]any{"x": "n"}, map[string]any{"x": json.Number("1")},
			map[string]any{"a": "b", "c": "d"}, map[string]any{"a": `b"c"sd`},
			map[string]any{"a": "b", "c": "d", "e": "f", "g": "h", "i": "j", "k": "l", "m": "n", "o": "p", "q": "r"},
		}}},
	}
	b := newTermBuilder(nil)
	for round := range 3 {
		got, err := b.objects(objs)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range objs {
			want := ast.NullValue
			if o != nil {
				if want, err = ast.InterfaceToValue(o.Object); err != nil {
					t.Fatal(err)
				}
			}
			if g := got.Value.(*ast.Array).Elem(i).Value; g.Compare(want) != 0 {
				t.Fatalf("round %d, object %d: got %v, want %v", round, i, g, want)
			}
		}
	}
}

func TestTermBuilderNamesWhatItCannotConvert(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"kind": "VirtualMachine", "metadata": map[string]any{"name": "vm-1"},
		"spec": map[string]any{"bad": []any{"ok", make(chan int)}},
	}}
	_, err := newTermBuilder(nil).object(u)
	if err == nil {
		t.Fatal("converted a channel")
	}
	if want := "convert VirtualMachine vm-1: spec: bad: [1]:"; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Fatalf("error %q does not start with %q", err, want)
	}
}

// TestTermBuilderSharesEqualLeaves: equal small objects of scalars (the ownerReferences of a
// pool's VMs) are one value, objects with more keys than leafKeys or with other values not.
func TestTermBuilderSharesEqualLeaves(t *testing.T) {
	owner := func() any {
		return []any{map[string]any{"kind": "VirtualMachinePool", "name": "p", "uid": "u", "controller": true}}
	}
	wide := func() any {
		m := map[string]any{}
		for i := range leafKeys + 1 {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	nested := func() any { return map[string]any{"a": []any{"b"}} }
	vm := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": name, "ownerReferences": owner()},
			"wide":     wide(), "nested": nested(),
		}}
	}
	b := newTermBuilder(nil)
	got, err := b.objects([]*unstructured.Unstructured{vm("a"), vm("b")})
	if err != nil {
		t.Fatal(err)
	}
	find := func(i int, path ...string) ast.Value {
		v, err := got.Value.(*ast.Array).Elem(i).Value.Find(ast.MustParseRef("x." + strings.Join(path, "."))[1:])
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if a, b := find(0, "metadata", "ownerReferences[0]"), find(1, "metadata", "ownerReferences[0]"); a != b {
		t.Errorf("equal ownerReferences are two values")
	}
	for _, field := range []string{"wide", "nested", "metadata"} {
		if a, b := find(0, field), find(1, field); a == b {
			t.Errorf("%s: shared, want a value each", field)
		}
	}
}

// TestTermBuilderTellsLeavesApart: leaves whose keys and values run together alike, or whose
// values differ only in type, are values of their own.
func TestTermBuilderTellsLeavesApart(t *testing.T) {
	leaves := []any{
		map[string]any{"a": "bc"},
		map[string]any{"ab": "c"},
		map[string]any{"a": "b", "c": "d"},
		map[string]any{"a": "b\"c", "d": "e"},
		map[string]any{"a": "1"},
		map[string]any{"a": int64(1)},
		map[string]any{"a": float64(1)},
		map[string]any{"a": true},
		map[string]any{"a": "true"},
		map[string]any{"a": nil},
		map[string]any{"a": ""},
	}
	b := newTermBuilder(nil)
	got, err := b.object(&unstructured.Unstructured{Object: map[string]any{"leaves": leaves}})
	if err != nil {
		t.Fatal(err)
	}
	arr := got.Value.(ast.Object).Get(ast.StringTerm("leaves")).Value.(*ast.Array)
	for i := range leaves {
		want, err := ast.InterfaceToValue(leaves[i])
		if err != nil {
			t.Fatal(err)
		}
		if v := arr.Elem(i).Value; v.Compare(want) != 0 {
			t.Errorf("leaf %d: %v, want %v", i, v, want)
		}
	}
}
