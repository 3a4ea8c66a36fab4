package eval

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsjson "sigs.k8s.io/json"

	poolv1alpha1 "github.com/virt-rules/virt-rules/api/pool/v1alpha1"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// The kinds the pool plan reads besides VMIs.
var (
	kindPool           = schema.GroupKind{Group: "pool.virt-rules.io", Kind: "VirtualMachinePool"}
	kindVirtualMachine = schema.GroupKind{Group: "kubevirt.io", Kind: "VirtualMachine"}
	kindDataVolume     = schema.GroupKind{Group: "cdi.kubevirt.io", Kind: "DataVolume"}
)

// labelPreserved marks the DataVolumes kept by Offline state preservation (the pool
// controller's label; the plan reads only those).
const labelPreserved = "pool.virt-rules.io/preserved"

// PoolResult is the plan for one VirtualMachinePool: the VM names of each action, sorted.
type PoolResult struct {
	Pool string `json:"pool"`
	// APIVersion is the pool's: pool.virt-rules.io/v1alpha1 for virt-rules' own pools,
	// pool.kubevirt.io/v1beta1 (or v1alpha1) for KubeVirt's.
	APIVersion string `json:"apiVersion,omitempty"`
	// Preview is true for KubeVirt's own pools: the plan is what KubeVirt's pool controller
	// does next (the pool decision's kubevirt semantics), which virt-rules does not apply.
	Preview bool `json:"preview,omitempty"`
	// Message says why a preview plans nothing (the pool is paused or being deleted).
	Message     string   `json:"message,omitempty"`
	Create      []string `json:"create"`
	Delete      []string `json:"delete"`
	Update      []string `json:"update"`
	Restart     []string `json:"restart"`
	Reprovision []string `json:"reprovision"`
}

// unknownPoolFields are the fields of pool (outside its VM template, which is KubeVirt's) that
// the VirtualMachinePool type does not have, such as upstream's spec.selector.
func unknownPoolFields(pool manifest.Object) []string {
	return unknownFields(pool, "template", &poolv1alpha1.VirtualMachinePool{})
}

// unknownFields are the fields of obj that typed (a pointer to its Go type) does not have,
// sorted, leaving out spec.<template>: a VM template, which KubeVirt's own types judge. A type
// error gives none: the decision's own checks name its field.
func unknownFields(obj manifest.Object, template string, typed any) []string {
	copied := obj.Unstructured.DeepCopy().Object
	if spec, ok := copied["spec"].(map[string]any); ok {
		delete(spec, template)
	}
	raw, err := json.Marshal(copied)
	if err != nil {
		return nil
	}
	strict, err := sigsjson.UnmarshalStrict(raw, typed)
	if err != nil {
		return nil
	}
	var fields []string
	for _, e := range strict {
		var unknown interface{ FieldPath() string }
		if errors.As(e, &unknown) {
			fields = append(fields, unknown.FieldPath())
		} else {
			fields = append(fields, e.Error())
		}
	}
	slices.Sort(fields)
	return fields
}

// pools plans every VirtualMachinePool over the VMs, VMIs and kept DataVolumes of its
// namespace, at now.
func (in *inputs) pools(ctx context.Context, eng *engine.Engine, now time.Time, opts Options, warn func(string)) ([]PoolResult, error) {
	results := make([]PoolResult, 0, len(in.poolObjs))
	for _, p := range in.poolObjs {
		for _, field := range unknownPoolFields(p) {
			warn(fmt.Sprintf("%s: %s: %s: pool.virt-rules.io/v1alpha1 has no such field: ignored here, dropped by a cluster", p.Locate(field), p.Describe(), field))
		}
		input := engine.PoolInput{Pool: p.Unstructured, Now: now}
		for _, vm := range in.vms {
			if vm.GetNamespace() == p.GetNamespace() {
				input.VMs = append(input.VMs, vm.Unstructured)
			}
		}
		for _, vmi := range in.vmis {
			if vmi.GetNamespace() == p.GetNamespace() {
				input.VMIs = append(input.VMIs, vmi.Unstructured)
			}
		}
		for _, dv := range in.dataVolumes {
			if _, kept := dv.GetLabels()[labelPreserved]; kept && dv.GetNamespace() == p.GetNamespace() {
				input.Volumes = append(input.Volumes, dv.Unstructured)
			}
		}
		done := opts.observe("pools")
		plan, err := eng.PoolPlan(ctx, input)
		done()
		if err != nil {
			if err := in.decideError(ctx, p, err); err != nil {
				return nil, err
			}
			continue
		}
		results = append(results, poolResult(p, plan))
	}
	return results, nil
}

// sortPools sorts pool results by pool, then API version.
func sortPools(results []PoolResult) {
	slices.SortFunc(results, func(a, b PoolResult) int {
		return cmp.Or(strings.Compare(a.Pool, b.Pool), strings.Compare(a.APIVersion, b.APIVersion))
	})
}

func poolResult(p manifest.Object, plan *engine.PoolPlan) PoolResult {
	r := PoolResultOf(p.GetNamespace()+"/"+p.GetName(), plan)
	r.APIVersion = p.GetAPIVersion()
	return r
}

// PoolResultOf is plan, the plan of the pool named by key (namespace/name), as eval reports it.
func PoolResultOf(key string, plan *engine.PoolPlan) PoolResult {
	r := PoolResult{Pool: key, Restart: sorted(plan.Restart)}
	for _, c := range plan.Create {
		r.Create = append(r.Create, c.Name)
	}
	for _, d := range plan.Delete {
		r.Delete = append(r.Delete, d.Name)
	}
	for _, u := range plan.Update {
		r.Update = append(r.Update, u.Name)
	}
	for _, rp := range plan.Reprovision {
		r.Reprovision = append(r.Reprovision, rp.Name)
	}
	r.Create, r.Delete, r.Update, r.Reprovision = sorted(r.Create), sorted(r.Delete), sorted(r.Update), sorted(r.Reprovision)
	return r
}

func sorted(names []string) []string {
	out := slices.Clone(names)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return out
}

// fieldErrors are the engine.FieldErrors in err, however joined.
func fieldErrors(err error) []*engine.FieldError {
	var out []*engine.FieldError
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case *engine.FieldError:
			out = append(out, x)
		case interface{ Unwrap() []error }:
			for _, inner := range x.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return out
}
