package eval

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// A designField is a field the design proposals use that KubeVirt's own schema does not have.
// eval still reads it; a cluster drops it (or refuses the object), so eval warns whoever sets
// it and names what works on a cluster instead.
type designField struct {
	kind    schema.GroupKind
	path    []string
	problem string
}

var designFields = slices.Concat([]designField{{
	kind: kindMigration,
	path: []string{"spec", "addedNodeSelectorTerm"},
	problem: "KubeVirt's VirtualMachineInstanceMigration has no such field: a cluster drops it and the migration runs unconstrained; " +
		"put the term, as JSON, in the annotation migrations.virt-rules.io/added-node-selector-term",
}, {
	kind: kindKubeVirt,
	path: []string{"spec", "configuration", "migrations", "requireHostModelMigratabilityLevel"},
	problem: "KubeVirt's KubeVirt CR has no such field: a cluster drops it; " +
		`use the annotation migrations.virt-rules.io/require-host-model-migratability-level: "N"`,
}},
	// The design spells it "prefered"; the correct spelling is read too.
	designFieldsOf(kindKubeVirt, []string{"spec", "configuration", "migrations"},
		[]string{"preferedHostModelMigratabilityLevel", "preferredHostModelMigratabilityLevel"},
		"KubeVirt's KubeVirt CR has no such field: a cluster drops it; "+
			`use the annotation migrations.virt-rules.io/preferred-host-model-migratability-level: '{"level": N, "weight": W}'`),
	designFieldsOf(kindMigrationPolicy, []string{"spec", "selectors"},
		[]string{"virtualMachineInstanceSelector", "namespaceSelector"},
		"KubeVirt's MigrationPolicy schema refuses the {matchLabels: ...} shape (422): write the labels as a plain map",
		"matchLabels"),
)

// designFieldsOf is one designField per name under parent (then under suffix, if any), all with
// the same problem.
func designFieldsOf(kind schema.GroupKind, parent, names []string, problem string, suffix ...string) []designField {
	fields := make([]designField, 0, len(names))
	for _, name := range names {
		path := append(append(append([]string{}, parent...), name), suffix...)
		fields = append(fields, designField{kind: kind, path: path, problem: problem})
	}
	return fields
}

// warnDesignFields warns, for each object, of every design field it sets.
func warnDesignFields(objs []manifest.Object, warn func(string)) {
	for _, o := range objs {
		gk := o.GroupVersionKind().GroupKind()
		for _, f := range designFields {
			if f.kind != gk {
				continue
			}
			if _, found, _ := unstructured.NestedFieldNoCopy(o.Object, f.path...); !found {
				continue
			}
			warn(fmt.Sprintf("%s: %s: %s: %s", o.Locate(strings.Join(f.path, ".")), o.Describe(), strings.Join(f.path, "."), f.problem))
		}
	}
}
