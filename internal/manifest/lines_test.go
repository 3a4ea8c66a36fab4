package manifest

import (
	"errors"
	"strings"
	"testing"
)

// A file as people write it: comments, several documents, a List; each field's line is the
// line an editor shows it on.
const commented = `# Policies for the prod cluster.
# Owned by the platform team.
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata:
  name: fine
spec:
  selectors:
    namespaceSelector:
      kubevirt.io/tier: gold
---
# The broken one.

apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata:
  name: broken-bandwidth
  labels:
    team: infra
spec:
  allowAutoConverge: true
  # Lots of bandwidth.
  bandwidthPerMigration: lots
  selectors:
    virtualMachineInstanceSelector:
      workload: db
---
apiVersion: v1
kind: List
items:
- apiVersion: kubevirt.io/v1
  kind: VirtualMachineInstanceMigration
  metadata:
    name: m0
    namespace: prod
  spec:
    vmiName: a
# between items
- apiVersion: kubevirt.io/v1
  kind: VirtualMachineInstanceMigration
  metadata:
    name: m1
    namespace: prod
  spec:
    vmiName: b
    description: |
      - not an item
      items: not a key
  status:
    phase: Succeeded
`

func TestLinesAreTheLinesOfTheFields(t *testing.T) {
	objs, err := Parse("prod.yaml", strings.NewReader(commented))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 4 {
		t.Fatalf("%d objects, want 4", len(objs))
	}
	for _, c := range []struct {
		obj         int
		field       string
		line        int
		description string
	}{
		{0, "", 3, "the first object, after its comments"},
		{0, "spec.selectors.namespaceSelector.kubevirt.io/tier", 10, "a label key with dots and a slash"},
		{1, "", 14, "the second document, after a comment and a blank line"},
		{1, "spec.bandwidthPerMigration", 23, "a field deep in the second document, after a comment"},
		{1, "metadata.labels.team", 19, "a label"},
		{1, "spec.selectors.virtualMachineInstanceSelector.workload", 26, "a selector's label"},
		{1, "spec.nothere", 20, "a missing field: its parent's line"},
		{2, "", 31, "a List's first item"},
		{2, "spec.vmiName", 37, "a List item's field"},
		{3, "", 39, "a List's second item, after a comment between items"},
		{3, "status.phase", 50, "past a block scalar that looks like an item and a key"},
	} {
		if got := objs[c.obj].LineOf(c.field); got != c.line {
			t.Errorf("%s: object %d %q: line %d, want %d", c.description, c.obj, c.field, got, c.line)
		}
	}
	e := objs[1].Errorf("spec.bandwidthPerMigration", "%s", "want a quantity")
	if got, want := e.Error(), "prod.yaml:23: MigrationPolicy broken-bandwidth: spec.bandwidthPerMigration: want a quantity"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	if got, want := objs[3].Errorf("spec.vmiName", "gone").Error(), "prod.yaml:45: VirtualMachineInstanceMigration prod/m1: items[1].spec.vmiName: gone"; got != want {
		t.Errorf("List item error %q, want %q", got, want)
	}
}

func TestJSONListLines(t *testing.T) {
	const list = `{
  "apiVersion": "v1",
  "kind": "List",
  "metadata": {"resourceVersion": ""},
  "items": [
    {
      "apiVersion": "v1",
      "kind": "Namespace",
      "metadata": {"name": "a"}
    },
    {
      "apiVersion": "v1",
      "kind": "Namespace",
      "metadata": {
        "name": "b",
        "labels": {"x.io/y": 1}
      }
    }
  ]
}
`
	objs, err := Parse("ns.json", strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{objs[0].Line, objs[1].Line, objs[1].LineOf("metadata.labels.x.io/y")}; got[0] != 6 || got[1] != 11 || got[2] != 16 {
		t.Errorf("lines %v, want [6 11 16]", got)
	}
}

func TestUnreadableDocumentsAreErrorsAtTheirLines(t *testing.T) {
	const bad = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n# next\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n  name: c\n---\n- a list\n"
	objs, err := Parse("bad.yaml", strings.NewReader(bad))
	if len(objs) != 1 {
		t.Errorf("%d objects, want the good one", len(objs))
	}
	errs, rest := Errors(err)
	if rest != nil || len(errs) != 2 {
		t.Fatalf("errors %v, rest %v: want two object errors", errs, rest)
	}
	if errs[0].Location != "bad.yaml:10" || errs[0].Reason != ReasonUnreadable || !strings.Contains(errs[0].Message, `"name"`) {
		t.Errorf("duplicate key: %+v, want bad.yaml:10, the key named", errs[0])
	}
	if errs[1].Location != "bad.yaml:12" || !strings.Contains(errs[1].Message, "want a Kubernetes object") {
		t.Errorf("a list document: %+v", errs[1])
	}
	_, err = Parse("sep.yaml", strings.NewReader("a: b\n--- x\n"))
	if errs, _ := Errors(err); len(errs) != 1 || errs[0].Location != "sep.yaml:2" {
		t.Errorf("bad separator: %v", err)
	}
}

func TestErrorsSplitsObjectErrorsFromTheRest(t *testing.T) {
	a := &Error{Location: "f.yaml:10", Message: "a"}
	b := &Error{Location: "f.yaml:9", Message: "b"}
	other := errors.New("read g.yaml: no such file")
	objs, rest := Errors(errors.Join(a, errors.Join(b, other)))
	if len(objs) != 2 || rest == nil || rest.Error() != other.Error() {
		t.Fatalf("objects %v, rest %v", objs, rest)
	}
	SortErrors(objs)
	if objs[0] != b {
		t.Errorf("sorted by line as a number: %v", objs)
	}
}
