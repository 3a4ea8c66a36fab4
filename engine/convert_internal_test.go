package engine

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTermBuilderGivesInterfaceToValuesValues: the pool input's converter gives the value
// ast.InterfaceToValue gives, for every JSON type as unstructured objects hold them (int64,
// float64, json.Number, nested lists and maps), across its blocks of terms (arrays longer than
// a block, many objects), and for objects sharing keys and strings.
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
	}
	b := newTermBuilder()
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
	_, err := newTermBuilder().object(u)
	if err == nil {
		t.Fatal("converted a channel")
	}
	if want := "convert VirtualMachine vm-1: spec: bad: [1]:"; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Fatalf("error %q does not start with %q", err, want)
	}
}
