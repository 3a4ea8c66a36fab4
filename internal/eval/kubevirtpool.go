package eval

// KubeVirt's own pools (pool.kubevirt.io VirtualMachinePool, v1beta1 and v1alpha1, served by
// KubeVirt 1.7 and later) are previewed: planned by the pool decision with KubeVirt's
// semantics ("kubevirt", judged step by step against KubeVirt's own pool controller in
// test/kubevirt), as what KubeVirt's controller does next. virt-rules applies none of it.
//
// The pool decision reads virt-rules' pool type, so a KubeVirt pool is translated field by
// field (KubeVirtPoolAsVirtRules). What it cannot read directly is which VMs are up to date:
// KubeVirt labels each VM and VMI with the ControllerRevision of the pool spec it was made
// from (kubevirt.io/vm-pool-revision-name) and takes it as outdated when that revision's VM
// template differs from the pool's, or when the label or the revision is missing. The
// decision compares template hashes instead; so each VM and VMI is given the hash virt-rules
// would have written on it had it made it from its revision's template (stamp), and one with
// no revision gets none: outdated, as KubeVirt takes it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	virtv1 "kubevirt.io/api/core/v1"
	poolv1beta1 "kubevirt.io/api/pool/v1beta1"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// annotationTemplateHash is the pool decision's template hash on a VM and its VMI template
// (the pool controller's AnnotationTemplateHash, the Rego package's annotation_template_hash).
const annotationTemplateHash = "pool.virt-rules.io/template-hash"

// semanticsKubeVirt is the pool decision's semantics of KubeVirt's own pool controller.
const semanticsKubeVirt = "kubevirt"

// kubevirtPoolRevision says whether o, a ControllerRevision, is one KubeVirt's pool
// controller wrote: its controller is a pool.kubevirt.io VirtualMachinePool.
func kubevirtPoolRevision(o manifest.Object) bool {
	for _, ref := range o.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err == nil && gv.Group == kindKubeVirtPool.Group && ref.Kind == kindKubeVirtPool.Kind && ref.Controller != nil && *ref.Controller {
			return true
		}
	}
	return false
}

// kubevirtPoolPreviews plans every pool.kubevirt.io VirtualMachinePool with the pool
// decision's kubevirt semantics: a preview of what KubeVirt's pool controller does next.
func (in *inputs) kubevirtPoolPreviews(ctx context.Context, eng *engine.Engine, now time.Time, opts Options, warn func(string)) ([]PoolResult, error) {
	results := make([]PoolResult, 0, len(in.kubevirtPools))
	stamps := map[string]stamp{}
	for _, p := range in.kubevirtPools {
		r, err := in.kubevirtPoolPreview(ctx, eng, p, now, opts, stamps, warn)
		if err != nil {
			if uf := (*unsupportedField)(nil); errors.As(err, &uf) && ctx.Err() == nil {
				in.failed[objectKey(p)] = true
				in.errs = append(in.errs, p.Error(manifest.ReasonUnsupported, uf.field, "%s", uf.message))
				continue
			}
			if err := in.decideError(ctx, p, err); err != nil {
				return nil, err
			}
			continue
		}
		results = append(results, r)
	}
	return results, nil
}

func (in *inputs) kubevirtPoolPreview(ctx context.Context, eng *engine.Engine, p manifest.Object, now time.Time, opts Options, stamps map[string]stamp, warn func(string)) (PoolResult, error) {
	key := p.GetNamespace() + "/" + p.GetName()
	input, idle, err := in.kubevirtPoolInput(ctx, eng, p, now, stamps, warn)
	if err != nil {
		return PoolResult{}, err
	}
	if idle != "" {
		return PoolResult{Pool: key, APIVersion: p.GetAPIVersion(), Preview: true, Message: idle,
			Create: []string{}, Delete: []string{}, Update: []string{}, Restart: []string{}, Reprovision: []string{}}, nil
	}
	done := opts.observe("pools")
	plan, err := eng.PoolPlan(ctx, input)
	done()
	if err != nil {
		return PoolResult{}, asKubeVirtPoolFields(err)
	}
	r := PoolResultOf(key, plan)
	r.APIVersion, r.Preview = p.GetAPIVersion(), true
	return r, nil
}

// KubeVirtPoolInput is the pool decision's input for p, a pool.kubevirt.io pool, over objs
// (the VMs, VMIs and ControllerRevisions of its namespace; other objects are ignored): the
// pool in virt-rules' terms, each VM and VMI stamped with the template hash of its revision,
// and the semantics of KubeVirt's own controller. eval's preview of p is the plan of this
// input (test/kubevirt judges it against KubeVirt's pool controller). idle is why KubeVirt's
// controller plans nothing for p (paused, being deleted), with no input; warnings are what
// eval warns about p.
func KubeVirtPoolInput(ctx context.Context, eng *engine.Engine, p manifest.Object, objs []manifest.Object, now time.Time) (input engine.PoolInput, idle string, warnings []string, err error) {
	warn := func(s string) { warnings = append(warnings, s) }
	in := sortInputs(objs, func(string) {})
	input, idle, err = in.kubevirtPoolInput(ctx, eng, p, now, map[string]stamp{}, warn)
	if err == nil && len(in.errs) > 0 {
		errs := make([]error, len(in.errs))
		for i, e := range in.errs {
			errs[i] = e
		}
		err = errors.Join(errs...)
	}
	return input, idle, warnings, err
}

func (in *inputs) kubevirtPoolInput(ctx context.Context, eng *engine.Engine, p manifest.Object, now time.Time, stamps map[string]stamp, warn func(string)) (engine.PoolInput, string, error) {
	for _, field := range unknownKubeVirtPoolFields(p) {
		warn(fmt.Sprintf("%s: %s: %s: %s has no such field: ignored here, dropped by a cluster", p.Locate(field), p.Describe(), field, p.GetAPIVersion()))
	}
	pool, err := KubeVirtPoolAsVirtRules(p.Unstructured)
	if err != nil {
		return engine.PoolInput{}, "", err
	}
	paused, _, _ := unstructured.NestedBool(p.Object, "spec", "paused")
	switch {
	case p.GetDeletionTimestamp() != nil:
		return engine.PoolInput{}, "being deleted: KubeVirt's pool controller neither scales nor updates it", nil
	case paused:
		return engine.PoolInput{}, "paused (spec.paused): KubeVirt's pool controller neither scales nor updates it until it is resumed", nil
	}

	revisions := map[string]manifest.Object{}
	for _, r := range in.revisions {
		if r.GetNamespace() == p.GetNamespace() {
			revisions[r.GetName()] = r
		}
	}
	missing := map[string][]string{} // revision name -> VMs naming it
	stampOf := func(obj manifest.Object) (stamp, bool) {
		name := obj.GetLabels()[virtv1.VirtualMachinePoolRevisionName]
		if name == "" {
			return stamp{}, false
		}
		rev, ok := revisions[name]
		if !ok {
			missing[name] = append(missing[name], obj.GetName())
			return stamp{}, false
		}
		if !in.decided(rev) {
			return stamp{}, false
		}
		st, err := stampRevision(ctx, eng, rev, p, now, stamps)
		if err != nil {
			if ctx.Err() == nil {
				in.fail(rev, err)
			}
			return stamp{}, false
		}
		return st, true
	}

	input := engine.PoolInput{Pool: pool, Now: now, Semantics: semanticsKubeVirt}
	for _, vm := range in.vms {
		if vm.GetNamespace() != p.GetNamespace() {
			continue
		}
		st, ok := stampOf(vm)
		input.VMs = append(input.VMs, stamped(vm.Unstructured, st.vm, ok))
	}
	for _, vmi := range in.vmis {
		if vmi.GetNamespace() != p.GetNamespace() {
			continue
		}
		st, ok := stampOf(vmi)
		input.VMIs = append(input.VMIs, stamped(vmi.Unstructured, st.vmi, ok))
	}
	if err := ctx.Err(); err != nil {
		return engine.PoolInput{}, "", err
	}
	for _, name := range sortedKeys(missing) {
		vms := slices.Compact(slices.Sorted(slices.Values(missing[name])))
		warn(fmt.Sprintf("%s: %s: ControllerRevision %s/%s, named by %s (label %s), is not among the inputs: previewed as outdated, as KubeVirt's pool controller takes a VM whose revision is missing",
			p.Position(), p.Describe(), p.GetNamespace(), name, strings.Join(vms, ", "), virtv1.VirtualMachinePoolRevisionName))
	}
	return input, "", nil
}

// stamp is the template hash virt-rules writes on a VM made from one template, and on its VMI.
type stamp struct{ vm, vmi string }

// stamped is obj with the template hash hash when ok; without any otherwise (outdated).
func stamped(obj *unstructured.Unstructured, hash string, ok bool) *unstructured.Unstructured {
	out := obj.DeepCopy()
	annotations := out.GetAnnotations()
	delete(annotations, annotationTemplateHash)
	if ok {
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[annotationTemplateHash] = hash
	}
	out.SetAnnotations(annotations)
	return out
}

// stampRevision is how virt-rules stamps a VM made from the pool spec rev holds: the plan of
// that spec for one VM of pool p. Memoised in stamps by namespace/name.
func stampRevision(ctx context.Context, eng *engine.Engine, rev, p manifest.Object, now time.Time, stamps map[string]stamp) (stamp, error) {
	key := rev.GetNamespace() + "/" + rev.GetName()
	if st, ok := stamps[key]; ok {
		return st, nil
	}
	data, ok := rev.Object["data"].(map[string]any)
	if !ok {
		return stamp{}, &engine.FieldError{Field: "data", Message: "want the pool spec KubeVirt's pool controller stores, an object"}
	}
	// The template alone decides the stamps.
	spec := map[string]any{"replicas": int64(1), "selector": data["selector"], "virtualMachineTemplate": data["virtualMachineTemplate"]}
	one := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": p.GetAPIVersion(), "kind": p.GetKind(),
		"metadata": map[string]any{"name": p.GetName(), "namespace": p.GetNamespace(), "uid": string(p.GetUID())},
		"spec":     spec,
	}}
	pool, err := KubeVirtPoolAsVirtRules(one)
	if err != nil {
		return stamp{}, fmt.Errorf("its pool spec: %w", asRevisionFields(err))
	}
	plan, err := eng.PoolPlan(ctx, engine.PoolInput{Pool: pool, Now: now, Semantics: semanticsKubeVirt})
	if err != nil {
		return stamp{}, fmt.Errorf("its pool spec: %w", asRevisionFields(asKubeVirtPoolFields(err)))
	}
	if len(plan.Create) != 1 {
		return stamp{}, fmt.Errorf("its pool spec: a plan of one VM creates %d", len(plan.Create))
	}
	vm := &unstructured.Unstructured{Object: plan.Create[0].VM}
	vmi, _, _ := unstructured.NestedString(vm.Object, "spec", "template", "metadata", "annotations", annotationTemplateHash)
	st := stamp{vm: vm.GetAnnotations()[annotationTemplateHash], vmi: vmi}
	if st.vm == "" || st.vmi == "" {
		return stamp{}, errors.New("its pool spec: the plan of one VM gives no template hash")
	}
	stamps[key] = st
	return st, nil
}

// KubeVirtPoolAsVirtRules is KubeVirt's pool (pool.kubevirt.io v1beta1, or v1alpha1, whose
// spec is the same field for field in KubeVirt's API) in virt-rules' terms
// (pool.virt-rules.io/v1alpha1): the same pool, field by field, for the pool decision. Its
// spec goes through KubeVirt's own Go type first, as KubeVirt reads it (and writes it into
// ControllerRevisions), so that equal templates are equal values. A value KubeVirt's type
// refuses is an engine.FieldError naming KubeVirt's field; a field virt-rules' decision has no
// counterpart for (nodeSelectorRequirementMatcher) is one too, saying so.
func KubeVirtPoolAsVirtRules(kv *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	raw, err := json.Marshal(kv.Object["spec"])
	if err != nil {
		return nil, &engine.FieldError{Field: "spec", Message: err.Error()}
	}
	var typed poolv1beta1.VirtualMachinePoolSpec
	if err := json.Unmarshal(raw, &typed); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, &engine.FieldError{Field: "spec." + te.Field, Message: fmt.Sprintf("KubeVirt's VirtualMachinePool type refuses it: want %s, not a JSON %s", te.Type, te.Value)}
		}
		return nil, &engine.FieldError{Field: "spec", Message: fmt.Sprintf("KubeVirt's VirtualMachinePool type refuses it: %v", err)}
	}
	if typed.VirtualMachineTemplate == nil {
		return nil, &engine.FieldError{Field: "spec.virtualMachineTemplate", Message: "required, a VirtualMachine template (metadata and spec)"}
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&typed)
	if err != nil {
		return nil, &engine.FieldError{Field: "spec", Message: err.Error()}
	}
	spec := withoutNulls(m).(map[string]any)

	out := map[string]any{"replicas": int64(1)} // KubeVirt's default
	if typed.Replicas != nil {
		out["replicas"] = int64(*typed.Replicas)
	}
	if v, ok := spec["maxUnavailable"]; ok {
		out["maxUnavailable"] = v
	}
	if g := typed.NameGeneration; g != nil {
		ng := map[string]any{}
		if g.AppendIndexToConfigMapRefs != nil {
			ng["appendPostfixToConfigMapReferences"] = *g.AppendIndexToConfigMapRefs
		}
		if g.AppendIndexToSecretRefs != nil {
			ng["appendPostfixToSecretReferences"] = *g.AppendIndexToSecretRefs
		}
		out["nameGeneration"] = ng
	}
	var errs []error
	for _, strategy := range []string{"updateStrategy", "scaleInStrategy"} {
		s, ok := spec[strategy].(map[string]any)
		if !ok {
			continue
		}
		translated := map[string]any{}
		for _, kind := range slices.Sorted(maps.Keys(s)) {
			body, ok := s[kind].(map[string]any)
			if !ok {
				translated[kind] = s[kind]
				continue
			}
			body = maps.Clone(body)
			// KubeVirt's controller keeps the PVCs for Online as for Offline (v1.8's
			// isStatePreservationEnabled: anything but Disabled), memory not yet: the
			// decision's Offline.
			if body["statePreservation"] == "Online" {
				body["statePreservation"] = "Offline"
			}
			if sp, ok := body["selectionPolicy"].(map[string]any); ok {
				field := "spec." + strategy + "." + kind + ".selectionPolicy"
				policy, err := selectionPolicyAsVirtRules(field, sp)
				if err != nil {
					errs = append(errs, err)
				}
				body["selectionPolicy"] = policy
			}
			translated[kind] = body
		}
		out[strategy] = translated
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if a := typed.Autohealing; a != nil {
		ah := map[string]any{}
		if a.StartUpFailureThreshold != nil {
			ah["startupFailureThreshold"] = int64(*a.StartUpFailureThreshold)
		}
		if a.MinFailingToStartDuration != nil {
			ah["minFailingToStartDuration"] = a.MinFailingToStartDuration.Duration.String()
		}
		out["autohealing"] = ah
	}
	tmpl, _ := spec["virtualMachineTemplate"].(map[string]any)
	template := map[string]any{"spec": tmpl["spec"]}
	if meta, ok := tmpl["metadata"].(map[string]any); ok {
		m := map[string]any{}
		for _, k := range []string{"labels", "annotations"} {
			if v, ok := meta[k]; ok {
				m[k] = v
			}
		}
		template["metadata"] = m
	}
	if template["spec"] == nil {
		template["spec"] = map[string]any{}
	}
	out["template"] = template
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "pool.virt-rules.io/v1alpha1", "kind": "VirtualMachinePool",
		"metadata": map[string]any{"name": kv.GetName(), "namespace": kv.GetNamespace(), "uid": string(kv.GetUID())},
		"spec":     out,
	}}, nil
}

// selectionPolicyAsVirtRules: KubeVirt's sortPolicy is virt-rules' basePolicy, its one set of
// selectors virt-rules' one ordered policy (which, under semantics kubevirt, filters).
func selectionPolicyAsVirtRules(field string, sp map[string]any) (map[string]any, error) {
	out := map[string]any{}
	if v, ok := sp["sortPolicy"]; ok {
		out["basePolicy"] = v
	}
	sel, ok := sp["selectors"].(map[string]any)
	if !ok {
		return out, nil
	}
	if _, ok := sel["nodeSelectorRequirementMatcher"]; ok {
		return out, &unsupportedField{field: field + ".selectors.nodeSelectorRequirementMatcher",
			message: "the pool decision has no node selector matcher yet, so it cannot preview which VMs KubeVirt takes"}
	}
	if ls, ok := sel["labelSelector"]; ok {
		out["orderedPolicies"] = []any{map[string]any{"labelSelector": ls}}
	}
	return out, nil
}

// unsupportedField is a field of KubeVirt's the decision does not model.
type unsupportedField struct{ field, message string }

func (e *unsupportedField) Error() string { return e.field + ": " + e.message }

func withoutNulls(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range t {
			if x != nil {
				out[k] = withoutNulls(x)
			}
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = withoutNulls(x)
		}
		return out
	}
	return v
}

// unknownKubeVirtPoolFields are the fields of a KubeVirt pool outside its VM template that
// KubeVirt's VirtualMachinePool type does not have.
func unknownKubeVirtPoolFields(p manifest.Object) []string {
	return unknownFields(p, "virtualMachineTemplate", &poolv1beta1.VirtualMachinePool{})
}

// kubevirtFields are virt-rules' pool fields and KubeVirt's, where their names differ.
var kubevirtFields = []struct{ virtRules, kubevirt string }{
	{"spec.template", "spec.virtualMachineTemplate"},
	{".selectionPolicy.basePolicy", ".selectionPolicy.sortPolicy"},
	{".selectionPolicy.orderedPolicies[0].labelSelector", ".selectionPolicy.selectors.labelSelector"},
	{"spec.nameGeneration.appendPostfixToConfigMapReferences", "spec.nameGeneration.appendIndexToConfigMapRefs"},
	{"spec.nameGeneration.appendPostfixToSecretReferences", "spec.nameGeneration.appendIndexToSecretRefs"},
	{"spec.autohealing.startupFailureThreshold", "spec.autohealing.startUpFailureThreshold"},
}

// KubeVirtPoolField is the field of KubeVirt's pool that field of its translation
// (KubeVirtPoolAsVirtRules) comes from.
func KubeVirtPoolField(field string) string {
	for _, f := range kubevirtFields {
		if i := strings.Index(field, f.virtRules); i >= 0 {
			rest := field[i+len(f.virtRules):]
			if rest == "" || rest[0] == '.' || rest[0] == '[' {
				field = field[:i] + f.kubevirt + rest
			}
		}
	}
	return field
}

// asKubeVirtPoolFields is err with the fields of each engine.FieldError in it named as
// KubeVirt's pool names them.
func asKubeVirtPoolFields(err error) error { return renameFields(err, KubeVirtPoolField) }

// asRevisionFields is err with each field of the pool spec named as in a ControllerRevision,
// where the spec is data.
func asRevisionFields(err error) error {
	return renameFields(err, func(field string) string {
		if rest, ok := strings.CutPrefix(field, "spec"); ok {
			return "data" + rest
		}
		return field
	})
}

// renameFields is err with the field of each engine.FieldError in it renamed; err itself when
// it holds none.
func renameFields(err error, rename func(string) string) error {
	fields := fieldErrors(err)
	if len(fields) == 0 {
		return err
	}
	out := make([]error, len(fields))
	for i, f := range fields {
		out[i] = &engine.FieldError{Field: rename(f.Field), Message: f.Message}
	}
	return errors.Join(out...)
}
