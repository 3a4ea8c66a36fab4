package eval_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// Quantities beyond int64 are errors naming the object, its field and line, in the KubeVirt CR
// as in a MigrationPolicy: KubeVirt's resource.Quantity would silently read 2^63-1 bytes. The
// VMI is decided all the same, as if there were no KubeVirt CR and the policy matched nothing.
func TestRunRefusesQuantitiesBeyondInt64(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const stream = `apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec: {configuration: {migrations: {bandwidthPerMigration: 99999999Ei}}}
---
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: p}
spec: {selectors: {virtualMachineInstanceSelector: {a: b}}, bandwidthPerMigration: 8Ei}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: v, labels: {a: b}}
`
	objs, err := manifest.Parse("in.yaml", strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	r, err := eval.Run(ctx, eng, objs, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`in.yaml:1: KubeVirt kubevirt/kubevirt: decided as if there were no KubeVirt CR`,
		`in.yaml:4: KubeVirt kubevirt/kubevirt: spec.configuration.migrations.bandwidthPerMigration: "99999999Ei" is beyond int64: KubeVirt would read 9223372036854775807`,
		`in.yaml:9: MigrationPolicy p: spec.bandwidthPerMigration: "8Ei" is beyond int64: KubeVirt would read 9223372036854775807`,
	}
	if got := errorLines(r.Errors); !slices.Equal(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A cluster can store p (KubeVirt's CRD takes 8Ei): the controller marks it invalid and
	// decides with it, and so does eval.
	if len(r.MigrationPolicies) != 1 || r.MigrationPolicies[0].Policy == nil || *r.MigrationPolicies[0].Policy != "p" {
		t.Errorf("migration policies %+v: want default/v decided, obeying p", r.MigrationPolicies)
	}
}

// A cluster's dump, as kubectl get -A -o yaml writes it after a while: finished migrations
// (Succeeded, Failed) of VMIs deleted long ago are history, reported with their phase and
// never an error; a VMI KubeVirt is done with keeps its policy decision; a pending migration
// of an absent VMI and one invalid policy among valid ones are one error each, at the line of
// the field at fault, and everything else is decided.
func TestRunDecidesAroundObjectsInError(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const stream = `# prod, as dumped
apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {allocatable: {cpu: "4", memory: 8Gi, pods: "110"}}
---
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels: {tier: gold}
---
# the policy everyone obeys
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: gold}
spec:
  selectors:
    namespaceSelector: {tier: gold}
  allowPostCopy: true
---
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata:
  name: broken-bandwidth
spec:
  selectors:
    namespaceSelector: {tier: gold}
    virtualMachineInstanceSelector: {app: db}
  # someone's idea of a quantity
  bandwidthPerMigration: lots
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: db-1, namespace: prod, labels: {app: db}}
status: {nodeName: node-1, phase: Running}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: batch-done, namespace: prod}
status: {phase: Succeeded}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: old-move, namespace: prod}
spec: {vmiName: db-old-0}
status: {phase: Succeeded}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: old-fail, namespace: prod}
spec: {vmiName: db-old-1}
status: {phase: Failed}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: lost, namespace: prod}
spec:
  vmiName: gone
status: {phase: Pending}
`
	objs, err := manifest.Parse("prod.yaml", strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	r, err := eval.Run(ctx, eng, objs, eval.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Each at the line of its field, as the text has it.
	want := []string{
		fmt.Sprintf(`prod.yaml:%d: MigrationPolicy broken-bandwidth: spec.bandwidthPerMigration: "lots" is not a quantity such as 64Mi, 1Gi, 100M or 1e9 (KubeVirt's MigrationPolicy type refuses it: no cluster stores this policy, and the VMIs are decided without it)`, lineOf(t, stream, "bandwidthPerMigration: lots")),
		fmt.Sprintf(`prod.yaml:%d: VirtualMachineInstanceMigration prod/lost: spec.vmiName: VirtualMachineInstance prod/gone is not among the inputs, and the migration is not finished (phase Pending)`, lineOf(t, stream, "vmiName: gone")),
	}
	if got := errorLines(r.Errors); !slices.Equal(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(r.Errors) == 2 && (r.Errors[0].Reason != manifest.ReasonInvalid || r.Errors[1].Reason != manifest.ReasonInconsistent) {
		t.Errorf("reasons %q, %q: want Invalid, Inconsistent", r.Errors[0].Reason, r.Errors[1].Reason)
	}
	var policies []string
	for _, p := range r.MigrationPolicies {
		policy := "<none>"
		if p.Policy != nil {
			policy = *p.Policy
		}
		policies = append(policies, p.VMI+" "+p.Phase+" "+policy)
	}
	// The broken policy would outrank gold for db-1 (one more label): it matches nothing.
	if want := []string{"prod/batch-done Succeeded gold", "prod/db-1  gold"}; !slices.Equal(policies, want) {
		t.Errorf("migration policies %q, want %q", policies, want)
	}
	var targets []string
	for _, m := range r.MigrationTargets {
		if m.CandidateNodes != nil || m.Error != nil || m.TargetNodeAffinity != nil {
			t.Errorf("%s: finished, yet decided: %+v", m.Migration, m)
		}
		targets = append(targets, m.Migration+" "+m.VMI+" "+m.Phase)
	}
	if want := []string{"prod/old-fail prod/db-old-1 Failed", "prod/old-move prod/db-old-0 Succeeded"}; !slices.Equal(targets, want) {
		t.Errorf("migration targets %q, want %q", targets, want)
	}
	if len(r.SchedulingAffinity) != 0 {
		t.Errorf("scheduling affinity %+v: want none (db-1 is on a node, batch-done is done)", r.SchedulingAffinity)
	}
}

// errorLines are errs as printed.
func errorLines(errs []*manifest.Error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// lineOf is the 1-based line of text holding the only occurrence of s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	if strings.Count(text, s) != 1 {
		t.Fatalf("%q: want it once in the text", s)
	}
	return strings.Count(text[:strings.Index(text, s)], "\n") + 1
}
