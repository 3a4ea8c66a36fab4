package eval

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What the controllers and webhooks store, and drift compares with the decisions. The names
// are the controllers' (controllers/migrationpolicy, controllers/nodelabeller); they are public
// contracts, repeated here so eval needs no controller package.
const (
	annotationPolicy        = "migrations.virt-rules.io/policy"
	annotationConfiguration = "migrations.virt-rules.io/configuration"
	labelLevel              = "kubevirt/host-model-migratability-level"
)

// DriftResult is one stored value that differs from its decision: what a controller or
// webhook would write, or a pool's VMs its plan would change. Stored is null when the value is
// absent; Decided is null when the decision removes it.
type DriftResult struct {
	Kind    string `json:"kind"`
	Object  string `json:"object"`
	Field   string `json:"field"`
	Stored  any    `json:"stored"`
	Decided any    `json:"decided"`
}

// drift compares the stored objects with the report's decisions: a VMI's policy and
// configuration annotations and its status.migrationState's policy and configuration, a
// node's level label, a pool's VMs.
func (in *inputs) drift(r *Report) []DriftResult {
	var out []DriftResult
	add := func(kind, object, field string, stored, decided any) {
		if !reflect.DeepEqual(stored, decided) {
			out = append(out, DriftResult{Kind: kind, Object: object, Field: field, Stored: stored, Decided: decided})
		}
	}
	policies := map[string]MigrationPolicyResult{}
	for _, p := range r.MigrationPolicies {
		policies[p.VMI] = p
	}
	for _, o := range in.vmis {
		key := o.GetNamespace() + "/" + o.GetName()
		d, ok := policies[key]
		if !ok {
			continue
		}
		var policy any
		if d.Policy != nil {
			policy = *d.Policy
		}
		configuration := jsonValue(d.Configuration)
		annotations := o.GetAnnotations()
		add("VirtualMachineInstance", key, "metadata.annotations."+annotationPolicy, stringOrNil(annotations, annotationPolicy), policy)
		add("VirtualMachineInstance", key, "metadata.annotations."+annotationConfiguration, storedJSON(annotations, annotationConfiguration), configuration)
		if state, found, _ := unstructured.NestedMap(o.Object, "status", "migrationState"); found && state != nil {
			add("VirtualMachineInstance", key, "status.migrationState.migrationPolicyName", state["migrationPolicyName"], policy)
			add("VirtualMachineInstance", key, "status.migrationState.migrationConfiguration", state["migrationConfiguration"], configuration)
		}
	}
	levels := map[string]any{}
	for _, n := range r.NodeMigratability {
		levels[n.Node] = strconv.Itoa(n.Level)
	}
	for _, o := range in.nodes {
		add("Node", o.GetName(), "metadata.labels."+labelLevel, stringOrNil(o.GetLabels(), labelLevel), levels[o.GetName()])
	}
	for _, p := range r.Pools {
		stored := in.poolVMs(p.Pool)
		decided := slices.DeleteFunc(slices.Concat(stored, p.Create), func(name string) bool { return slices.Contains(p.Delete, name) })
		slices.Sort(decided)
		add("VirtualMachinePool", p.Pool, "vms", stored, decided)
		pending := map[string]any{}
		for action, names := range map[string][]string{"update": p.Update, "restart": p.Restart, "reprovision": p.Reprovision} {
			if len(names) > 0 {
				pending[action] = names
			}
		}
		if len(pending) > 0 {
			add("VirtualMachinePool", p.Pool, "pending", nil, pending)
		}
	}
	slices.SortStableFunc(out, func(a, b DriftResult) int {
		return strings.Compare(a.Kind+" "+a.Object, b.Kind+" "+b.Object)
	})
	return out
}

// poolVMs are the names of the VMs the pool (namespace/name) controls, sorted.
func (in *inputs) poolVMs(pool string) []string {
	names := []string{}
	for _, vm := range in.vms {
		for _, ref := range vm.GetOwnerReferences() {
			if ref.Controller != nil && *ref.Controller && ref.Kind == kindPool.Kind && vm.GetNamespace()+"/"+ref.Name == pool {
				names = append(names, vm.GetName())
			}
		}
	}
	slices.Sort(names)
	return names
}

func stringOrNil(m map[string]string, key string) any {
	if v, ok := m[key]; ok {
		return v
	}
	return nil
}

// storedJSON is the JSON value of an annotation, its text when it is not JSON, nil when absent.
func storedJSON(annotations map[string]string, key string) any {
	text, ok := annotations[key]
	if !ok {
		return nil
	}
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return text
	}
	return v
}

// jsonValue is v as encoding/json reads it back (maps, slices, float64s), to compare with
// what was stored.
func jsonValue(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		return nil
	}
	return out
}
