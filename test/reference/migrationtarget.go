package reference

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// The migration target decision (design 001): where a VirtualMachineInstanceMigration that
// adds a node selector term may take its VMI, with the Kubernetes scheduler's semantics for
// node selector terms, taints and tolerations, and resource fit (CPU in millicores, memory in
// bytes, each quantity rounded up). Where the decision chooses otherwise, on purpose, so does
// the reference:
//   - an added term without requirements adds no constraint: design 001's
//     AddedNodeSelectorTerm "is empty by default (all Nodes match)" and its merge appends
//     nothing, so the candidates and the target affinity are as if no term were given;
//   - a cordoned node (spec.unschedulable or the node.kubernetes.io/unschedulable taint) is
//     never a candidate, whatever the VMI tolerates;
//   - of what every kubelet reports (cpu, memory, ephemeral-storage, pods), one missing from a
//     node's allocatable is not checked (a node manifest written by hand may leave it out); a
//     node without allocatable at all is not checked. The scheduler reads them as 0; a real
//     node always lists them. Any other resource the node does not list it has none of;
//   - each quantity is rounded up (CPU to millicores, memory to bytes) before quantities are
//     added, where the scheduler adds a pod's quantities exactly and rounds the total: the two
//     differ only for quantities finer than 1m or 1 byte;
//   - required node affinity with an empty term list constrains nothing;
//   - of several CPU vendor labels on the VMI's node, the first in order binds the target
//     (virt-controller takes whichever its map iteration yields first).
//
// Like KubeVirt's virt-controller (createTargetPod, NodeSelectorRenderer), a host-model VMI's
// CPU requirements come from its source launcher pod's nodeSelector when that has CPU entries
// (a VMI that migrated before), else from the host-model labels of its node, and a node
// without them takes no host-model VMI; the target pod also requires the VMI's machine type (machine-type.node.kubevirt.io/<status.machine.type, else
// spec.domain.machine.type>) and the CPU vendor label of the VMI's node, unless the VMI's
// nodeSelector names a vendor itself. What NodeSelectorRenderer puts in every launcher pod's
// nodeSelector is required too (RendererSelector): kubevirt.io/schedulable=true, the VMI's
// architecture (kubernetes.io/arch), a named CPU
// model, the CPU features the VMI requires; and no label of a feature it forbids
// (ForbiddenLabels), nor, host-model, node-labeller.kubevirt.io/obsolete-host-model. A VMI
// without CPU model is read as host-model, its required features
// required, as KubeVirt's webhook defaults the model before the renderer sees the VMI.
//
// Capacity is what kube-scheduler counts (k8s.io/component-helpers resource.PodRequests, the
// fit plugin skipping a resource requested at 0): for the pods on a node, and for the target
// pod, whose requests are the source launcher pod's (virt-controller renders both from the
// VMI, KubeVirt's memory overhead included). Without the source pod the VMI's requests stand in.

// AddedNodeSelectorTermAnnotation carries an added term as JSON on a migration.
const AddedNodeSelectorTermAnnotation = "migrations.virt-rules.io/added-node-selector-term"

// The reasons a migration has no target node, in the order they are checked. (InvalidTerm and
// InvalidInput come first in the decision; the reference takes well-formed input only.)
const (
	// TargetInvalidInput: the VMI runs on a node not among the nodes, whose CPU vendor and
	// host-model CPU bind the target (the decision's InvalidInput; the reference checks no
	// other malformation).
	TargetInvalidInput               = "InvalidInput"
	TargetNodeNotFound               = "NodeNotFound"
	TargetAlreadyOnNode              = "AlreadyOnNode"
	TargetConflictsWithVMConstraints = "ConflictsWithVMConstraints"
	TargetNoCapacity                 = "NoCapacity"
	TargetNoMatchingNode             = "NoMatchingNode"
)

// Labels and taints the decision reads.
const (
	targetHostModelCPUPrefix      = "host-model-cpu.node.kubevirt.io/"
	targetRequiredFeaturePrefix   = "host-model-required-features.node.kubevirt.io/"
	targetCPUModelMigrationPrefix = "cpu-model-migration.node.kubevirt.io/"
	targetCPUFeaturePrefix        = "cpu-feature.node.kubevirt.io/"
	targetCPUModelPrefix          = "cpu-model.node.kubevirt.io/"
	targetObsoleteHostModelLabel  = "node-labeller.kubevirt.io/obsolete-host-model"
	targetCPUVendorPrefix         = "cpu-vendor.node.kubevirt.io/"
	targetMachineTypePrefix       = "machine-type.node.kubevirt.io/"
	targetSchedulableLabel        = "kubevirt.io/schedulable"
	targetCordonTaint             = "node.kubernetes.io/unschedulable"
	targetNodeNameField           = "metadata.name"
)

// TargetCheck is how far a node gets through the checks, each node stopping at the first it
// fails: the added term, not being the VMI's node, the VMI's constraints, schedulability, room.
type TargetCheck int

const (
	TargetFailsAddedTerm TargetCheck = iota + 1
	TargetIsCurrentNode
	TargetConflicts
	TargetUnschedulable
	TargetNoRoom
	TargetCandidate
)

// TargetInput is what the decision reads, well-formed.
type TargetInput struct {
	// AddedTerms are spec.addedNodeSelectorTerm and the annotation's term, those given, in
	// that order.
	AddedTerms []corev1.NodeSelectorTerm
	// AddedSelector is spec.addedNodeSelector: one In requirement per entry.
	AddedSelector map[string]string
	VMI           kubevirtv1.VirtualMachineInstance
	Nodes         []corev1.Node
	// Pods whose requests use their nodes' allocatable resources.
	Pods []corev1.Pod
	// SourcePod is the VMI's current virt-launcher pod, nil when not given.
	SourcePod *corev1.Pod
	// ClusterNodeSelectors are the KubeVirt CR's developerConfiguration.nodeSelectors.
	ClusterNodeSelectors map[string]string
}

// TargetDecision is the reference's answer.
type TargetDecision struct {
	// Candidates are the candidate nodes' names, sorted.
	Candidates []string
	// Affinity is the node affinity the target pod gets.
	Affinity *corev1.NodeAffinity
	// Reason says why there is no candidate; "" when there is one.
	Reason string
	// Checks tells, by node name, the check each node stopped at.
	Checks map[string]TargetCheck
}

// Constrained tells whether the migration adds a constraint, a requirement; an empty term or
// an empty selector adds none.
func (in *TargetInput) Constrained() bool {
	added := in.AddedTerm()
	return len(added.MatchExpressions)+len(added.MatchFields) > 0
}

// AddedTerm is every added requirement in one term: those of the given terms in order, then
// one In requirement per selector entry, by key.
func (in *TargetInput) AddedTerm() corev1.NodeSelectorTerm {
	var term corev1.NodeSelectorTerm
	for _, t := range in.AddedTerms {
		term.MatchExpressions = append(term.MatchExpressions, t.MatchExpressions...)
		term.MatchFields = append(term.MatchFields, t.MatchFields...)
	}
	for _, key := range slices.Sorted(maps.Keys(in.AddedSelector)) {
		term.MatchExpressions = append(term.MatchExpressions, corev1.NodeSelectorRequirement{
			Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{in.AddedSelector[key]},
		})
	}
	return term
}

// TargetAffinity is the VMI's node affinity with the added term ANDed into every required
// term, or the added term as the only required term; the VMI's own when nothing is added.
func (in *TargetInput) TargetAffinity() *corev1.NodeAffinity {
	var own *corev1.NodeAffinity
	if a := in.VMI.Spec.Affinity; a != nil {
		own = a.NodeAffinity
	}
	if !in.Constrained() {
		return own.DeepCopy()
	}
	added := in.AddedTerm()
	out := own.DeepCopy()
	if out == nil {
		out = &corev1.NodeAffinity{}
	}
	if out.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(out.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		out.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{added}}
		return out
	}
	terms := out.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, added.MatchExpressions...)
		terms[i].MatchFields = append(terms[i].MatchFields, added.MatchFields...)
	}
	return out
}

// hostModel tells whether the VMI has a host-model CPU (no model, as before KubeVirt's
// webhook defaults it, counts as host-model).
func (in *TargetInput) hostModel() bool {
	cpu := in.VMI.Spec.Domain.CPU
	return cpu == nil || cpu.Model == "" || cpu.Model == kubevirtv1.CPUModeHostModel
}

// podCPUSelector is the CPU entries of the source launcher pod's nodeSelector (a VMI that
// migrated before carries there the CPU of the node it first started on).
func (in *TargetInput) podCPUSelector() map[string]string {
	out := map[string]string{}
	if in.SourcePod == nil {
		return out
	}
	for key, value := range in.SourcePod.Spec.NodeSelector {
		if strings.Contains(key, targetCPUFeaturePrefix) || strings.Contains(key, targetCPUModelMigrationPrefix) {
			out[key] = value
		}
	}
	return out
}

// CPUSelector is what a node needs (label: value) to take the VMI's host-model CPU, as
// virt-controller's prepareNodeSelectorForHostCpuModel builds it: the source pod's CPU
// entries if any, else from the host-model labels of the VMI's node (values copied); empty
// for a VMI that is not host-model or when neither says the CPU (see HostModelUnplaceable).
func (in *TargetInput) CPUSelector() map[string]string {
	if !in.hostModel() {
		return map[string]string{}
	}
	if pod := in.podCPUSelector(); len(pod) > 0 {
		return pod
	}
	out := map[string]string{}
	source := in.node(in.VMI.Status.NodeName)
	if source == nil {
		return out
	}
	model := false
	for key, value := range source.Labels {
		if m, ok := strings.CutPrefix(key, targetHostModelCPUPrefix); ok {
			out[targetCPUModelMigrationPrefix+m] = value
			model = true
		} else if feature, ok := strings.CutPrefix(key, targetRequiredFeaturePrefix); ok {
			out[targetCPUFeaturePrefix+feature] = value
		}
	}
	if !model {
		return map[string]string{}
	}
	return out
}

// CPULabels are the keys of CPUSelector, sorted.
func (in *TargetInput) CPULabels() []string {
	return slices.Sorted(maps.Keys(in.CPUSelector()))
}

// HostModelUnplaceable tells whether virt-controller would create no target pod for the
// host-model VMI: its node is known but has no host-model-cpu label, and the source pod (if
// given) no CPU entries. Every node then conflicts.
func (in *TargetInput) HostModelUnplaceable() bool {
	source := in.node(in.VMI.Status.NodeName)
	if !in.hostModel() || source == nil || len(in.podCPUSelector()) > 0 {
		return false
	}
	for key := range source.Labels {
		if strings.HasPrefix(key, targetHostModelCPUPrefix) {
			return false
		}
	}
	return true
}

// KubeVirtSelector is what virt-controller's target pod requires beyond the VMI's own
// constraints and its host-model CPU, each label "true": the VMI's machine type and, unless
// the VMI's nodeSelector names a CPU vendor, the vendor label of the VMI's node.
func (in *TargetInput) KubeVirtSelector() map[string]string {
	out := map[string]string{}
	machine := ""
	if m := in.VMI.Status.Machine; m != nil && m.Type != "" {
		machine = m.Type
	} else if m := in.VMI.Spec.Domain.Machine; m != nil {
		machine = m.Type
	}
	if machine != "" {
		out[targetMachineTypePrefix+machine] = "true"
	}
	for key := range in.VMI.Spec.NodeSelector {
		if strings.HasPrefix(key, targetCPUVendorPrefix) {
			return out
		}
	}
	if source := in.node(in.VMI.Status.NodeName); source != nil {
		var vendors []string
		for key := range source.Labels {
			if strings.HasPrefix(key, targetCPUVendorPrefix) {
				vendors = append(vendors, key)
			}
		}
		if len(vendors) > 0 {
			out[slices.Min(vendors)] = "true"
		}
	}
	return out
}

// RendererSelector is what KubeVirt's NodeSelectorRenderer puts in the target pod's
// nodeSelector beyond the VMI's own entries (which override it): kubevirt.io/schedulable
// "true" and kubernetes.io/arch (the VMI's spec.architecture in lower case, if any). Where the
// source launcher pod's nodeSelector has one of these keys, its value is taken; a key the
// VMI's nodeSelector has is left to that. Then a named CPU model and the required features.
func (in *TargetInput) RendererSelector() map[string]string {
	out := map[string]string{}
	podOrDefault := func(key, fallback string) {
		if in.SourcePod != nil {
			if value, ok := in.SourcePod.Spec.NodeSelector[key]; ok {
				out[key] = value
				return
			}
		}
		if _, ok := in.VMI.Spec.NodeSelector[key]; !ok && fallback != "" {
			out[key] = fallback
		}
	}
	podOrDefault(targetSchedulableLabel, "true")
	podOrDefault(corev1.LabelArchStable, strings.ToLower(in.VMI.Spec.Architecture))
	// The KubeVirt CR's cluster-wide nodeSelectors, over the defaults, under the VMI's own.
	for key, value := range in.ClusterNodeSelectors {
		if _, ok := in.VMI.Spec.NodeSelector[key]; !ok {
			out[key] = value
		}
	}
	// What the renderer derives from the VMI (dedicated CPUs, Hyper-V, TSC frequency, realtime,
	// confidential computing): the source launcher pod's entries, rendered from the same VMI.
	if in.SourcePod != nil {
		for key, value := range in.SourcePod.Spec.NodeSelector {
			if vmiDerivedKey(key) {
				out[key] = value
			}
		}
	}
	if cpu := in.VMI.Spec.Domain.CPU; cpu != nil {
		if cpu.Model != "" && cpu.Model != kubevirtv1.CPUModeHostModel && cpu.Model != kubevirtv1.CPUModeHostPassthrough {
			out[targetCPUModelPrefix+cpu.Model] = "true"
		}
		// any model, a missing one read as host-model (see hostModel)
		for _, f := range cpu.Features {
			if f.Policy == "" || f.Policy == "require" {
				out[targetCPUFeaturePrefix+f.Name] = "true"
			}
		}
	}
	return out
}

// vmiDerivedKey: a nodeSelector key NodeSelectorRenderer derives from the VMI's devices and
// features (kubevirt.io/api core/v1 CPUManager, HypervLabel, RealtimeLabel, SEV*, TDX, Secure
// Execution; virt-controller topology's TSC frequency label).
func vmiDerivedKey(key string) bool {
	switch key {
	case "kubevirt.io/cpumanager", "kubevirt.io/realtime", "kubevirt.io/sev", "kubevirt.io/sev-es", "kubevirt.io/sev-snp", "kubevirt.io/s390-pv", "kubevirt.io/tdx":
		return true
	}
	return strings.HasPrefix(key, "hyperv.node.kubevirt.io/") || strings.HasPrefix(key, "scheduling.node.kubevirt.io/tsc-frequency-")
}

// ForbiddenLabels are the labels the target pod's node must not have: cpu-feature labels of
// the VMI's CPU features of policy forbid (setNodeAffinityForbiddenFeaturePolicy), any model.
// For a host-model VMI also node-labeller.kubevirt.io/obsolete-host-model
// (setNodeAffinityForHostModelCpuModel).
func (in *TargetInput) ForbiddenLabels() []string {
	var out []string
	if in.hostModel() {
		out = append(out, targetObsoleteHostModelLabel)
	}
	if cpu := in.VMI.Spec.Domain.CPU; cpu != nil {
		for _, f := range cpu.Features {
			if f.Policy == "forbid" {
				out = append(out, targetCPUFeaturePrefix+f.Name)
			}
		}
	}
	return out
}

func (in *TargetInput) node(name string) *corev1.Node {
	if name == "" {
		return nil
	}
	for i := range in.Nodes {
		if in.Nodes[i].Name == name {
			return &in.Nodes[i]
		}
	}
	return nil
}

// MigrationTarget decides the candidate nodes, the target affinity and, without candidates,
// the reason.
func MigrationTarget(in TargetInput) TargetDecision {
	d := TargetDecision{Candidates: []string{}, Affinity: in.TargetAffinity(), Checks: map[string]TargetCheck{}}
	if name := in.VMI.Status.NodeName; name != "" && len(in.Nodes) > 0 && in.node(name) == nil {
		d.Affinity, d.Reason = nil, TargetInvalidInput
		return d
	}
	j := newTargetJudge(&in)
	for i := range in.Nodes {
		node := &in.Nodes[i]
		check := j.check(node)
		d.Checks[node.Name] = check
		if check == TargetCandidate {
			d.Candidates = append(d.Candidates, node.Name)
		}
	}
	slices.Sort(d.Candidates)
	if len(d.Candidates) == 0 {
		d.Reason = j.reason(d.Checks)
	}
	return d
}

// targetJudge holds what every node is judged against.
type targetJudge struct {
	in          *TargetInput
	added       corev1.NodeSelectorTerm
	cpu         map[string]string
	unplaceable bool
	kubevirt    map[string]string
	renderer    map[string]string
	forbidden   []string
	requests    map[corev1.ResourceName]int64
	used        map[string]map[corev1.ResourceName]int64 // by node name
}

// kubeletResources are those every kubelet reports as allocatable.
var kubeletResources = map[corev1.ResourceName]bool{corev1.ResourceCPU: true, corev1.ResourceMemory: true, corev1.ResourceEphemeralStorage: true, corev1.ResourcePods: true}

// requestedResources are the resources pod requests anywhere: containers, init containers, pod
// level, overhead.
func requestedResources(pod *corev1.Pod) map[corev1.ResourceName]bool {
	names := map[corev1.ResourceName]bool{}
	lists := []corev1.ResourceList{pod.Spec.Overhead}
	if pod.Spec.Resources != nil {
		lists = append(lists, pod.Spec.Resources.Requests)
	}
	for _, c := range append(slices.Clone(pod.Spec.Containers), pod.Spec.InitContainers...) {
		lists = append(lists, c.Resources.Requests)
	}
	for _, list := range lists {
		for r := range list {
			names[r] = true
		}
	}
	return names
}

func newTargetJudge(in *TargetInput) *targetJudge {
	j := &targetJudge{in: in, added: in.AddedTerm(), cpu: in.CPUSelector(), unplaceable: in.HostModelUnplaceable(), kubevirt: in.KubeVirtSelector(),
		renderer: in.RendererSelector(), forbidden: in.ForbiddenLabels(),
		requests: map[corev1.ResourceName]int64{}, used: map[string]map[corev1.ResourceName]int64{}}
	if in.SourcePod != nil {
		for r := range requestedResources(in.SourcePod) {
			j.requests[r] = PodRequest(in.SourcePod, r)
		}
	} else {
		for r, q := range in.VMI.Spec.Domain.Resources.Requests {
			j.requests[r] = schedulerAmount(r, q)
		}
	}
	for _, pod := range in.Pods {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.Spec.NodeName == "" {
			continue
		}
		used := j.used[pod.Spec.NodeName]
		if used == nil {
			used = map[corev1.ResourceName]int64{}
			j.used[pod.Spec.NodeName] = used
		}
		for r := range j.requests {
			used[r] += PodRequest(&pod, r)
		}
		used[corev1.ResourcePods]++
	}
	return j
}

// PodRequest is a pod's request of resource r as kube-scheduler counts it: the larger of the
// sum over its containers and restartable init containers (sidecars) and, for each other init
// container, its request plus the sidecars before it; the pod-level request instead when the
// pod has one for r; plus spec.overhead. Quantities are rounded up one by one (schedulerAmount).
func PodRequest(pod *corev1.Pod, r corev1.ResourceName) int64 {
	amount := func(list corev1.ResourceList) int64 {
		if q, ok := list[r]; ok {
			return schedulerAmount(r, q)
		}
		return 0
	}
	var total int64
	if pod.Spec.Resources != nil && hasResource(pod.Spec.Resources.Requests, r) {
		total = amount(pod.Spec.Resources.Requests)
	} else {
		var containers, sidecars, initMax int64
		for _, c := range pod.Spec.Containers {
			containers += amount(c.Resources.Requests)
		}
		for _, c := range pod.Spec.InitContainers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				sidecars += amount(c.Resources.Requests)
				continue
			}
			initMax = max(initMax, amount(c.Resources.Requests)+sidecars)
		}
		total = max(containers+sidecars, initMax)
	}
	return total + amount(pod.Spec.Overhead)
}

func hasResource(list corev1.ResourceList, r corev1.ResourceName) bool {
	_, ok := list[r]
	return ok
}

func (j *targetJudge) check(node *corev1.Node) TargetCheck {
	switch {
	case !j.termMatches(j.added, node):
		return TargetFailsAddedTerm
	case node.Name == j.in.VMI.Status.NodeName:
		return TargetIsCurrentNode
	case j.conflicts(node):
		return TargetConflicts
	case j.unschedulable(node):
		return TargetUnschedulable
	case !j.fits(node):
		return TargetNoRoom
	}
	return TargetCandidate
}

// termMatches ANDs the requirements of term; an empty term matches every node here (for the
// added term, which then adds no constraint; the VMI's own empty terms match no node, see
// matchesVMIAffinity).
func (j *targetJudge) termMatches(term corev1.NodeSelectorTerm, node *corev1.Node) bool {
	for _, req := range term.MatchExpressions {
		value, ok := node.Labels[req.Key]
		if !j.expressionMatches(req, value, ok) {
			return false
		}
	}
	for _, req := range term.MatchFields {
		// Only metadata.name In/NotIn: a node has a name.
		if !j.expressionMatches(req, node.Name, true) {
			return false
		}
	}
	return true
}

func (j *targetJudge) expressionMatches(req corev1.NodeSelectorRequirement, value string, present bool) bool {
	switch req.Operator {
	case corev1.NodeSelectorOpIn:
		return present && slices.Contains(req.Values, value)
	case corev1.NodeSelectorOpNotIn:
		return !present || !slices.Contains(req.Values, value)
	case corev1.NodeSelectorOpExists:
		return present
	case corev1.NodeSelectorOpDoesNotExist:
		return !present
	case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
		if !present || len(req.Values) != 1 {
			return false
		}
		have, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return false
		}
		bound, err := strconv.ParseInt(req.Values[0], 10, 64)
		if err != nil {
			return false
		}
		if req.Operator == corev1.NodeSelectorOpGt {
			return have > bound
		}
		return have < bound
	}
	return false
}

func (j *targetJudge) conflicts(node *corev1.Node) bool {
	for key, want := range j.in.VMI.Spec.NodeSelector {
		if got, ok := node.Labels[key]; !ok || got != want {
			return true
		}
	}
	if !j.matchesVMIAffinity(node) {
		return true
	}
	for _, taint := range node.Spec.Taints {
		if (taint.Effect == corev1.TaintEffectNoSchedule || taint.Effect == corev1.TaintEffectNoExecute) &&
			taint.Key != targetCordonTaint && !j.tolerated(taint) {
			return true
		}
	}
	if j.unplaceable {
		return true
	}
	for key, want := range j.cpu {
		if got, ok := node.Labels[key]; !ok || got != want {
			return true
		}
	}
	for key, want := range j.kubevirt {
		if got, ok := node.Labels[key]; !ok || got != want {
			return true
		}
	}
	for key, want := range j.renderer {
		got, ok := node.Labels[key]
		// kubevirt.io/schedulable=false is judged as unschedulable, the later check
		if key == targetSchedulableLabel && got == "false" {
			continue
		}
		if !ok || got != want {
			return true
		}
	}
	for _, key := range j.forbidden {
		if _, ok := node.Labels[key]; ok {
			return true
		}
	}
	return false
}

// matchesVMIAffinity ORs the VMI's required terms; a term without requirements matches no
// node, and no terms at all leave every node.
func (j *targetJudge) matchesVMIAffinity(node *corev1.Node) bool {
	a := j.in.VMI.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return true
	}
	for _, term := range terms {
		if len(term.MatchExpressions)+len(term.MatchFields) > 0 && j.termMatches(term, node) {
			return true
		}
	}
	return false
}

// tolerated follows Kubernetes: an empty effect covers every effect, an empty key every key;
// Exists ignores the value, Equal (or no operator) compares it.
func (j *targetJudge) tolerated(taint corev1.Taint) bool {
	for _, t := range j.in.VMI.Spec.Tolerations {
		if t.Effect != "" && t.Effect != taint.Effect {
			continue
		}
		if t.Key != "" && t.Key != taint.Key {
			continue
		}
		switch t.Operator {
		case corev1.TolerationOpExists:
			return true
		case "", corev1.TolerationOpEqual:
			if t.Value == taint.Value {
				return true
			}
		}
	}
	return false
}

// unschedulable: cordoned, by the field or its taint, or labelled kubevirt.io/schedulable=false.
func (j *targetJudge) unschedulable(node *corev1.Node) bool {
	if node.Spec.Unschedulable {
		return true
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == targetCordonTaint && (taint.Effect == corev1.TaintEffectNoSchedule || taint.Effect == corev1.TaintEffectNoExecute) {
			return true
		}
	}
	return node.Labels[targetSchedulableLabel] == "false"
}

// fits, as kube-scheduler's fit plugin: the node runs fewer pods than its allocatable pods, and
// for every resource the target pod requests (more than 0 of), allocatable minus the requests
// of the node's pods leaves at least the request (see the package notes for what is not listed).
func (j *targetJudge) fits(node *corev1.Node) bool {
	if len(node.Status.Allocatable) == 0 {
		return true
	}
	if pods, ok := node.Status.Allocatable[corev1.ResourcePods]; ok && j.used[node.Name][corev1.ResourcePods]+1 > pods.Value() {
		return false
	}
	for r, request := range j.requests {
		if request <= 0 {
			continue
		}
		var amount int64
		if allocatable, ok := node.Status.Allocatable[r]; ok {
			amount = schedulerAmount(r, allocatable)
		} else if kubeletResources[r] {
			continue
		}
		if amount-j.used[node.Name][r] < request {
			return false
		}
	}
	return true
}

// schedulerAmount is a quantity as the scheduler's fit check counts it: CPU in millicores,
// memory in bytes, each rounded up.
func schedulerAmount(r corev1.ResourceName, q resource.Quantity) int64 {
	if r == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

func (j *targetJudge) reason(checks map[string]TargetCheck) string {
	reached := func(c TargetCheck) (names []string) {
		for name, got := range checks {
			if got >= c {
				names = append(names, name)
			}
		}
		return names
	}
	if named := j.namedNodes(); len(named) > 0 && !slices.ContainsFunc(named, func(name string) bool { return j.in.node(name) != nil }) {
		return TargetNodeNotFound
	}
	if matching := reached(TargetIsCurrentNode); len(matching) == 1 && matching[0] == j.in.VMI.Status.NodeName {
		return TargetAlreadyOnNode
	}
	if len(reached(TargetConflicts)) > 0 && len(reached(TargetUnschedulable)) == 0 {
		return TargetConflictsWithVMConstraints
	}
	if len(reached(TargetNoRoom)) > 0 {
		return TargetNoCapacity
	}
	return TargetNoMatchingNode
}

// namedNodes are the node names the added term's matchFields In requirements name.
func (j *targetJudge) namedNodes() []string {
	var names []string
	for _, req := range j.added.MatchFields {
		if req.Key == targetNodeNameField && req.Operator == corev1.NodeSelectorOpIn {
			names = append(names, req.Values...)
		}
	}
	return names
}

// TargetInputFromUnstructured reads the decision's input from objects as stored. The
// migration's added term may be a NodeSelectorTerm or a list of exactly one, in
// spec.addedNodeSelectorTerm or as JSON in the AddedNodeSelectorTermAnnotation.
func TargetInputFromUnstructured(migration, vmi *unstructured.Unstructured, nodes, pods []*unstructured.Unstructured) (TargetInput, error) {
	var in TargetInput
	if raw, ok, _ := unstructured.NestedFieldNoCopy(migration.Object, "spec", "addedNodeSelectorTerm"); ok && raw != nil {
		term, err := targetTerm(raw)
		if err != nil {
			return in, fmt.Errorf("read spec.addedNodeSelectorTerm: %w", err)
		}
		in.AddedTerms = append(in.AddedTerms, term)
	}
	if text, ok := migration.GetAnnotations()[AddedNodeSelectorTermAnnotation]; ok {
		var raw any
		if err := json.Unmarshal([]byte(text), &raw); err != nil {
			return in, fmt.Errorf("read annotation %s: %w", AddedNodeSelectorTermAnnotation, err)
		}
		term, err := targetTerm(raw)
		if err != nil {
			return in, fmt.Errorf("read annotation %s: %w", AddedNodeSelectorTermAnnotation, err)
		}
		in.AddedTerms = append(in.AddedTerms, term)
	}
	selector, _, err := unstructured.NestedStringMap(migration.Object, "spec", "addedNodeSelector")
	if err != nil {
		return in, fmt.Errorf("read spec.addedNodeSelector: %w", err)
	}
	in.AddedSelector = selector
	if err := remarshal(vmi.Object, &in.VMI); err != nil {
		return in, fmt.Errorf("read VMI: %w", err)
	}
	for _, obj := range nodes {
		var node corev1.Node
		if err := remarshal(obj.Object, &node); err != nil {
			return in, fmt.Errorf("read node %s: %w", obj.GetName(), err)
		}
		in.Nodes = append(in.Nodes, node)
	}
	for i, obj := range pods {
		var pod corev1.Pod
		if err := remarshal(obj.Object, &pod); err != nil {
			return in, fmt.Errorf("read pods[%d]: %w", i, err)
		}
		in.Pods = append(in.Pods, pod)
	}
	return in, nil
}

// SetSourcePod reads the VMI's current virt-launcher pod, as stored; nil leaves none.
func (in *TargetInput) SetSourcePod(obj *unstructured.Unstructured) error {
	if obj == nil {
		in.SourcePod = nil
		return nil
	}
	var pod corev1.Pod
	if err := remarshal(obj.Object, &pod); err != nil {
		return fmt.Errorf("read source pod: %w", err)
	}
	in.SourcePod = &pod
	return nil
}

// targetTerm reads a NodeSelectorTerm, or a list of exactly one.
func targetTerm(raw any) (corev1.NodeSelectorTerm, error) {
	var term corev1.NodeSelectorTerm
	if list, ok := raw.([]any); ok {
		if len(list) != 1 {
			return term, fmt.Errorf("want a list of exactly one term, got %d", len(list))
		}
		raw = list[0]
	}
	if _, ok := raw.(map[string]any); !ok {
		return term, fmt.Errorf("want a NodeSelectorTerm, got %T", raw)
	}
	return term, remarshal(raw, &term)
}
