// Package nodetrim is the one rule of what virt-rules keeps of a Node, applied alike to the
// manager's typed Node cache (controllers.TrimNode) and to the Nodes `virt-rules eval` reads
// from manifests (internal/eval), so that a bundle's rules read the same of a node offline as
// in the cluster:
//
//   - metadata, but managedFields: names, labels (every node decision), resourceVersion;
//   - spec, whole: spec.taints and spec.unschedulable (migration targets, levels);
//   - of status, allocatable (what a migration target must fit in) and conditions (no embedded
//     rule reads them, but a bundle's rules may: a node not Ready).
//
// Dropped: managedFields, and the rest of status (capacity, addresses, daemonEndpoints,
// nodeInfo, images, volumes, config, phase, runtimeHandlers, features), which no controller,
// webhook, Rego rule or reference implementation reads; nodeInfo and images are most of a real
// node's status.
//
// The rule is the two field lists below, by their JSON names; Typed finds the Go fields they
// name once, by their json tags, so the typed and the unstructured trims cannot drift.
package nodetrim

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// droppedMetadata are the fields of metadata dropped; the rest is kept.
var droppedMetadata = []string{"managedFields"}

// keptStatus are the fields of status kept; the rest is dropped.
var keptStatus = []string{"allocatable", "conditions"}

// Typed trims node in place.
func Typed(node *corev1.Node) {
	meta := reflect.ValueOf(&node.ObjectMeta).Elem()
	for _, i := range typedFields.metadata {
		meta.Field(i).SetZero()
	}
	status := reflect.ValueOf(&node.Status).Elem()
	for _, i := range typedFields.status {
		status.Field(i).SetZero()
	}
}

// Unstructured trims node, the content of an unstructured Node, in place: its metadata and
// status maps are replaced, not changed, so that a shallow copy's are left as they were.
func Unstructured(node map[string]any) {
	if meta, ok := node["metadata"].(map[string]any); ok {
		kept := make(map[string]any, len(meta))
		for k, v := range meta {
			if !slices.Contains(droppedMetadata, k) {
				kept[k] = v
			}
		}
		node["metadata"] = kept
	}
	if status, ok := node["status"].(map[string]any); ok {
		kept := make(map[string]any, len(keptStatus))
		for _, k := range keptStatus {
			if v, ok := status[k]; ok {
				kept[k] = v
			}
		}
		node["status"] = kept
	}
}

// typedFields are the positions of the Go fields Typed zeroes: those of ObjectMeta named in
// droppedMetadata, and those of NodeStatus not named in keptStatus.
var typedFields = struct{ metadata, status []int }{
	metadata: fieldsOf(reflect.TypeFor[metav1.ObjectMeta](), droppedMetadata, true),
	status:   fieldsOf(reflect.TypeFor[corev1.NodeStatus](), keptStatus, false),
}

// fieldsOf is the positions of struct t's fields whose JSON names are in names (in) or are not
// (!in). It panics when a name is no field of t (the API changed under the rule): a programming
// error, caught by any test that loads the package.
func fieldsOf(t reflect.Type, names []string, in bool) []int {
	var out []int
	found := 0
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			panic(fmt.Sprintf("nodetrim: %s.%s has no JSON name", t.Name(), t.Field(i).Name))
		}
		listed := slices.Contains(names, name)
		if listed {
			found++
		}
		if listed == in {
			out = append(out, i)
		}
	}
	if found != len(names) {
		panic(fmt.Sprintf("nodetrim: %s has %d of the fields %v", t.Name(), found, names))
	}
	return out
}
