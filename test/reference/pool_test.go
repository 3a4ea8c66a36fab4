package reference

import (
	"slices"
	"testing"
	"time"
)

func TestPlanPoolNamingExample(t *testing.T) {
	template := map[string]any{"spec": map[string]any{"running": true}}
	hash := TemplateHash(template)
	pool := map[string]any{
		"metadata": map[string]any{"name": "my-vm", "uid": "u"},
		"spec":     map[string]any{"replicas": int64(4), "template": template},
	}
	owner := []any{map[string]any{"kind": "VirtualMachinePool", "uid": "u", "controller": true}}
	var vms []map[string]any
	for _, name := range []string{"my-vm-1", "my-vm-3"} {
		vms = append(vms, map[string]any{
			"metadata": map[string]any{"name": name, "ownerReferences": owner, "annotations": map[string]any{"pool.virt-rules.io/template-hash": hash}},
			"spec":     map[string]any{"running": true},
		})
	}
	plan := PlanPool(pool, vms, nil, nil, time.Now(), 250, DefaultPoolSettings)
	if want := []string{"my-vm-2", "my-vm-4"}; !slices.Equal(plan.Create, want) {
		t.Fatalf("create %v, want %v", plan.Create, want)
	}
	if len(plan.Update) != 0 || len(plan.Delete) != 0 {
		t.Fatalf("update %v delete %v, want none", plan.Update, plan.Delete)
	}
}
