package eval_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// Quantities beyond int64 are errors naming the file, document and field, in the KubeVirt CR
// as in a MigrationPolicy: KubeVirt's resource.Quantity would silently read 2^63-1 bytes.
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
	_, err = eval.Run(ctx, eng, objs, eval.Options{})
	for _, want := range []string{
		`in.yaml:1: spec.configuration.migrations.bandwidthPerMigration: "99999999Ei" is beyond int64`,
		`in.yaml:2: spec.bandwidthPerMigration: "8Ei" is beyond int64`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v: want %q", err, want)
		}
	}
}

// A migration whose VMI is not among the inputs is an error in manifests; read from a live
// cluster (Options.Live), where a migration can outlive its VMI, it is skipped with a warning
// naming it, and the other migrations are decided.
func TestRunSkipsALiveMigrationWhoseVMIIsGone(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const stream = `apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {allocatable: {cpu: "4", memory: 8Gi, pods: "110"}}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: here, namespace: prod}
status: {nodeName: node-1}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: of-here, namespace: prod}
spec: {vmiName: here}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: of-gone, namespace: prod}
spec: {vmiName: gone}
`
	objs, err := manifest.Parse("in.yaml", strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	_, err = eval.Run(ctx, eng, objs, eval.Options{})
	if want := "VirtualMachineInstance prod/gone is not among the inputs"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("from manifests: error %v, want %q", err, want)
	}
	var warnings []string
	r, err := eval.Run(ctx, eng, objs, eval.Options{Live: true, Warn: func(line string) { warnings = append(warnings, line) }})
	if err != nil {
		t.Fatalf("live: %v", err)
	}
	if len(r.MigrationTargets) != 1 || r.MigrationTargets[0].Migration != "prod/of-here" {
		t.Errorf("live: migration targets %+v, want prod/of-here's only", r.MigrationTargets)
	}
	want := "VirtualMachineInstanceMigration prod/of-gone: its VirtualMachineInstance prod/gone is gone: not decided"
	if !slices.Contains(warnings, want) {
		t.Errorf("live: warnings %q, want %q", warnings, want)
	}
}
