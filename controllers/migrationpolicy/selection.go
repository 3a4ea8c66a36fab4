package migrationpolicy

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Which VMIs one MigrationPolicy can affect.
//
// A VMI's decision is the best of the policies it matches, so a change to one policy can
// change the decision only of VMIs the policy matches before or after the change. The
// controller re-decides those VMIs, not every VMI of the cluster. The selection is a superset
// of what the shipped rules match under either precedence (bundle setting), so that no
// affected VMI is missed:
//   - a selector value "" selects the key with any value (design 000; KubeVirt's precedence
//     reads it as the empty value, a subset);
//   - a VMI without labels is always selected (KubeVirt's precedence gives it the policy with
//     spec.selectors whose name sorts first, which any policy change can change);
//   - a namespace has the label kubernetes.io/metadata.name as the API server sets it, also
//     when unknown (the rules derive it);
//   - a selector of a shape the controller does not read (matchExpressions, non-string
//     values: the shipped rules match no VMI with it, a custom bundle might) selects every VMI.
//
// A policy without spec.selectors matches no VMI (as in KubeVirt).

// labelNamespaceName is the label the API server gives every Namespace.
const labelNamespaceName = "kubernetes.io/metadata.name"

// policySelection is what one MigrationPolicy can select.
type policySelection struct {
	// all: every VMI; none: no VMI. Otherwise the requirements below.
	all, none bool
	vmi       map[string]string // label key -> value, "" for any value
	namespace map[string]string
}

// selectionOf reads the selectors of policy.
func selectionOf(policy *unstructured.Unstructured) policySelection {
	selectors, found, err := unstructured.NestedFieldNoCopy(policy.Object, "spec", "selectors")
	if err != nil || !found || selectors == nil {
		return policySelection{none: true}
	}
	fields, ok := selectors.(map[string]any)
	if !ok {
		return policySelection{all: true}
	}
	vmi, ok := requirementsOf(fields["virtualMachineInstanceSelector"])
	if !ok {
		return policySelection{all: true}
	}
	namespace, ok := requirementsOf(fields["namespaceSelector"])
	if !ok {
		return policySelection{all: true}
	}
	return policySelection{vmi: vmi, namespace: namespace}
}

// requirementsOf reads one selector: null, {matchLabels: {key: value}} or a plain
// {key: value} map. ok is false for any other shape.
func requirementsOf(selector any) (reqs map[string]string, ok bool) {
	if selector == nil {
		return map[string]string{}, true
	}
	fields, isMap := selector.(map[string]any)
	if !isMap {
		return nil, false
	}
	if _, has := fields["matchExpressions"]; has {
		return nil, false
	}
	if labels, has := fields["matchLabels"]; has {
		if len(fields) != 1 {
			return nil, false
		}
		if fields, isMap = labels.(map[string]any); !isMap {
			return nil, false
		}
	}
	reqs = make(map[string]string, len(fields))
	for k, v := range fields {
		s, isString := v.(string)
		if !isString {
			return nil, false
		}
		reqs[k] = s
	}
	return reqs, true
}

// needsNamespaces tells whether selects reads namespace labels.
func (s policySelection) needsNamespaces() bool {
	return !s.all && !s.none && len(s.namespace) > 0
}

// selects tells whether the policy can match a VMI with vmiLabels in namespace, whose labels
// are namespaceLabels (nil when the namespace is unknown).
func (s policySelection) selects(vmiLabels map[string]string, namespace string, namespaceLabels map[string]string) bool {
	switch {
	case s.all:
		return true
	case s.none:
		return false
	case len(vmiLabels) == 0:
		return true
	}
	if !carries(vmiLabels, s.vmi, "") {
		return false
	}
	return carries(namespaceLabels, s.namespace, namespace)
}

// carries tells whether labels meet every requirement; with namespace != "", labels are a
// namespace's, which has kubernetes.io/metadata.name even when labels lack it.
func carries(labels, reqs map[string]string, namespace string) bool {
	for k, want := range reqs {
		have, ok := labels[k]
		if !ok && namespace != "" && k == labelNamespaceName {
			have, ok = namespace, true
		}
		if !ok || (want != "" && have != want) {
			return false
		}
	}
	return true
}
