package eval_test

import (
	"context"
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
