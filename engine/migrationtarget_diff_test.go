package engine_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The migration target differential test decides thousands of generated migrations with the
// engine and with the plain Go reference (test/reference, written from design 001 and
// the Kubernetes scheduler's semantics) and wants the same candidate nodes, the same reason
// when there is none, and the same target node affinity.

var (
	migrationTargetSeed  = flag.Uint64("migrationtarget.seed", 20010001, "seed of the migration target differential test")
	migrationTargetCases = flag.Int("migrationtarget.cases", 2000, "generated cases of the migration target differential test")
	// Exact fits such as 100m+200m used of 500m for a 200m request, and the u and n suffixes.
	migrationTargetHardQuantities = flag.Bool("migrationtarget.hard-quantities", true,
		"also generate CPU quantities that binary fractions cannot hold (100m, 200m, 300m) and sub-milli ones (u, n)")
)

func TestMigrationTargetDifferential(t *testing.T) {
	seed := *migrationTargetSeed
	t.Logf("seed %d (rerun with -migrationtarget.seed=%d)", seed, seed)
	eng, err := engine.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := &targetHarness{eng: eng}
	gen := newTargetGen(seed, *migrationTargetHardQuantities)
	covered := map[string]int{}
	for i := range *migrationTargetCases {
		c := gen.newCase(i)
		in, want, msg := h.disagreement(c, false, "")
		if msg != "" {
			h.report(t, c, msg)
			return
		}
		coverTarget(covered, in, want)
	}
	t.Logf("%d cases: %v", *migrationTargetCases, covered)
	for _, what := range []string{
		reference.TargetNodeNotFound, reference.TargetAlreadyOnNode, reference.TargetConflictsWithVMConstraints,
		reference.TargetNoCapacity, reference.TargetNoMatchingNode, reference.TargetInvalidInput,
		"candidates", "exact fit", "host-model CPU labels", "empty added term", "no added constraint",
		"CPU vendor", "machine type", "node without kubevirt.io/schedulable=true",
		"named CPU model", "required CPU feature", "architecture", "node with a forbidden CPU feature", "node with an obsolete host-model CPU", "host-model CPU from the source pod", "host-model VMI on a node without host-model label",
		"no room for the launcher pod", "source pod requests more than its containers", "source pod with a sidecar",
		"pod requests more than its containers", "pod with a sidecar", "pod with pod-level requests",
		"node with no room for another pod", "node without the device the launcher pod requests", "dedicated CPUs from the source pod", "KubeVirt CR nodeSelectors",
	} {
		if covered[what] == 0 {
			t.Errorf("no generated case exercised %q; the generator needs adjusting", what)
		}
	}
}

// targetCase is one decision's input as plain JSON values: "migration" and "vmi" objects,
// "nodes" and "pods" lists of objects.
type targetCase map[string]any

func (c targetCase) objects() (migration, vmi *unstructured.Unstructured, nodes, pods []*unstructured.Unstructured) {
	list := func(key string) []*unstructured.Unstructured {
		var out []*unstructured.Unstructured
		items, _ := c[key].([]any)
		for _, item := range items {
			obj, _ := item.(map[string]any)
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
		return out
	}
	m, _ := c["migration"].(map[string]any)
	v, _ := c["vmi"].(map[string]any)
	return &unstructured.Unstructured{Object: m}, &unstructured.Unstructured{Object: v}, list("nodes"), list("pods")
}

type targetHarness struct{ eng *engine.Engine }

func (h *targetHarness) engineDecision(c targetCase) (*engine.MigrationTargetDecision, error) {
	migration, vmi, nodes, pods := c.objects()
	view := h.eng.NewNodes()
	for _, node := range nodes {
		if err := view.Upsert(node); err != nil {
			return nil, err
		}
	}
	var source *unstructured.Unstructured
	if obj, ok := c["sourcePod"].(map[string]any); ok {
		source = &unstructured.Unstructured{Object: obj}
	}
	var kubevirt *unstructured.Unstructured
	if obj, ok := c["kubevirt"].(map[string]any); ok {
		kubevirt = &unstructured.Unstructured{Object: obj}
	}
	return h.eng.MigrationTarget(context.Background(), engine.MigrationTargetInput{Migration: migration, VMI: vmi, SourcePod: source, KubeVirt: kubevirt, Nodes: view, Pods: pods})
}

func (h *targetHarness) referenceDecision(c targetCase) (reference.TargetInput, reference.TargetDecision, error) {
	migration, vmi, nodes, pods := c.objects()
	in, err := reference.TargetInputFromUnstructured(migration, vmi, nodes, pods)
	if err != nil {
		return in, reference.TargetDecision{}, err
	}
	if obj, ok := c["sourcePod"].(map[string]any); ok {
		if err := in.SetSourcePod(&unstructured.Unstructured{Object: obj}); err != nil {
			return in, reference.TargetDecision{}, err
		}
	}
	if obj, ok := c["kubevirt"].(map[string]any); ok {
		selectors, _, _ := unstructured.NestedStringMap(obj, "spec", "configuration", "developerConfiguration", "nodeSelectors")
		in.ClusterNodeSelectors = selectors
	}
	return in, reference.MigrationTarget(in), nil
}

// disagreement describes how the engine and the reference decide c differently, "" if they
// agree. The generated cases are well-formed, so the engine calling one invalid is a
// disagreement too. While shrinking, a smaller input counts only if it fails the same way:
// both take it as well-formed and decide differently or, when invalid is the engine's
// complaint about the original input (see invalidity), the engine complains alike.
//
// It returns the reference's input and decision too, for the coverage counts.
func (h *targetHarness) disagreement(c targetCase, shrinking bool, invalid string) (reference.TargetInput, reference.TargetDecision, string) {
	var in reference.TargetInput
	var want reference.TargetDecision
	d, err := h.engineDecision(c)
	if err != nil {
		return in, want, fmt.Sprintf("engine: %v", err)
	}
	if shrinking && invalidity(d) != invalid {
		return in, want, ""
	}
	if invalidity(d) != "" {
		// The one malformation the generator makes on purpose: the VMI's node is not given.
		if rin, ref, err := h.referenceDecision(c); err == nil && ref.Reason == reference.TargetInvalidInput && d.Error.Reason == engine.ReasonInvalidInput {
			return rin, ref, ""
		}
		return in, want, fmt.Sprintf("engine calls well-formed input invalid: %s", targetMessage(d))
	}
	in, want, err = h.referenceDecision(c)
	switch {
	case err != nil && shrinking:
		return in, want, ""
	case err != nil:
		return in, want, fmt.Sprintf("reference: %v", err)
	}
	gotText := targetText(d.CandidateNodes, targetReason(d), d.TargetNodeAffinity)
	wantText := targetText(want.Candidates, want.Reason, want.Affinity)
	if gotText == wantText {
		return in, want, ""
	}
	return in, want, fmt.Sprintf("engine:    %s\nreference: %s\nengine message: %s", gotText, wantText, targetMessage(d))
}

var targetIndex = regexp.MustCompile(`\[[0-9]+\]`)

// invalidity is the engine's complaint about an input it calls invalid with list indexes and
// the migration's name left out, so that it stays the same as the input shrinks; "" for a
// valid input.
func invalidity(d *engine.MigrationTargetDecision) string {
	if d.Error == nil || (d.Error.Reason != engine.ReasonInvalidTerm && d.Error.Reason != engine.ReasonInvalidInput) {
		return ""
	}
	_, problem, _ := strings.Cut(d.Error.Message, ": ")
	return d.Error.Reason + ": " + targetIndex.ReplaceAllString(problem, "[]")
}

func targetReason(d *engine.MigrationTargetDecision) string {
	if d.Error == nil {
		return ""
	}
	return d.Error.Reason
}

func targetMessage(d *engine.MigrationTargetDecision) string {
	if d.Error == nil {
		return "none"
	}
	return d.Error.Message
}

// targetText renders a decision for comparison: candidates sorted, the affinity as JSON with
// null and empty lists dropped, so that nil and empty lists compare equal.
func targetText(candidates []string, reason string, affinity *corev1.NodeAffinity) string {
	sorted := slices.Sorted(slices.Values(candidates))
	if sorted == nil {
		sorted = []string{}
	}
	var text string
	if affinity == nil {
		text = "null"
	} else {
		raw, err := json.Marshal(affinity)
		if err != nil {
			return err.Error()
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return err.Error()
		}
		raw, err = json.Marshal(dropEmpty(v))
		if err != nil {
			return err.Error()
		}
		text = string(raw)
	}
	return fmt.Sprintf("candidates %v, reason %q, affinity %s", sorted, reason, text)
}

func dropEmpty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if e == nil {
				continue
			}
			if l, ok := e.([]any); ok && len(l) == 0 {
				continue
			}
			out[k] = dropEmpty(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = dropEmpty(e)
		}
		return out
	}
	return v
}

// report shrinks c to an input that still disagrees, dropping one node, pod, map entry or
// list element at a time, and reports it.
func (h *targetHarness) report(t *testing.T, c targetCase, msg string) {
	t.Helper()
	var invalid string
	if d, err := h.engineDecision(c); err == nil {
		invalid = invalidity(d)
	}
	// Every candidate is strictly smaller, so this ends. After a success the candidate at
	// the same position is the next one to try.
	for shrunk := true; shrunk; {
		shrunk = false
		paths := treePaths(map[string]any(c))
		for i := 0; i < len(paths); i++ {
			smaller := targetCase(removePath(map[string]any(c), paths[i]).(map[string]any))
			if _, _, msg := h.disagreement(smaller, true, invalid); msg != "" {
				c, shrunk = smaller, true
				paths = treePaths(map[string]any(c))
				i--
			}
		}
	}
	raw, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	_, _, minimal := h.disagreement(c, false, "")
	t.Errorf("engine and reference disagree on a generated case:\n%s\nminimal input:\n%s\n%s", msg, raw, minimal)
}

// treePaths lists, parents first, the paths to every map entry and list element below the
// top-level entries of root (those stay: the input's four parts).
func treePaths(root map[string]any) [][]any {
	var paths [][]any
	var walk func(v any, path []any)
	walk = func(v any, path []any) {
		switch x := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				p := append(slices.Clone(path), k)
				paths = append(paths, p)
				walk(x[k], p)
			}
		case []any:
			for i, e := range x {
				p := append(slices.Clone(path), i)
				paths = append(paths, p)
				walk(e, p)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(root)) {
		walk(root[k], []any{k})
	}
	return paths
}

// removePath copies v without the map entry or list element at path.
func removePath(v any, path []any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			switch {
			case k != path[0]:
				out[k] = e
			case len(path) > 1:
				out[k] = removePath(e, path[1:])
			}
		}
		return out
	case []any:
		out := make([]any, 0, len(x))
		for i, e := range x {
			switch {
			case i != path[0]:
				out = append(out, e)
			case len(path) > 1:
				out = append(out, removePath(e, path[1:]))
			}
		}
		return out
	}
	return v
}

// coverTarget counts what decided a case, so the test can tell that the generated cases reach
// every reason and the edges of the checks.
func coverTarget(covered map[string]int, in reference.TargetInput, d reference.TargetDecision) {
	if d.Reason == "" {
		covered["candidates"]++
	} else {
		covered[d.Reason]++
	}
	if d.Reason == reference.TargetNoMatchingNode {
		passed := 0
		for _, check := range d.Checks {
			if check > reference.TargetFailsAddedTerm {
				passed++
			}
		}
		if passed == 0 {
			covered["no node matches the added term"]++
		} else {
			covered["every matching node unschedulable"]++
		}
	}
	if len(in.CPULabels()) > 0 {
		covered["host-model CPU labels"]++
		if in.SourcePod != nil && slices.ContainsFunc(in.CPULabels(), func(l string) bool { _, ok := in.SourcePod.Spec.NodeSelector[l]; return ok }) {
			covered["host-model CPU from the source pod"]++
		}
	}
	for i := range in.Nodes {
		node := &in.Nodes[i]
		if value := node.Labels["kubevirt.io/schedulable"]; d.Checks[node.Name] == reference.TargetConflicts && value != "true" && value != "false" {
			covered["node without kubevirt.io/schedulable=true"]++
		}
	}
	for key := range in.RendererSelector() {
		switch {
		case strings.HasPrefix(key, "cpu-model.node.kubevirt.io/"):
			covered["named CPU model"]++
		case strings.HasPrefix(key, "cpu-feature.node.kubevirt.io/"):
			covered["required CPU feature"]++
		case key == "kubernetes.io/arch":
			covered["architecture"]++
		}
	}
	for _, key := range in.ForbiddenLabels() {
		for i := range in.Nodes {
			if _, ok := in.Nodes[i].Labels[key]; ok && d.Checks[in.Nodes[i].Name] == reference.TargetConflicts {
				if strings.HasPrefix(key, "cpu-feature.node.kubevirt.io/") {
					covered["node with a forbidden CPU feature"]++
				} else {
					covered["node with an obsolete host-model CPU"]++
				}
			}
		}
	}
	if in.HostModelUnplaceable() {
		covered["host-model VMI on a node without host-model label"]++
	}
	for key := range in.KubeVirtSelector() {
		if strings.HasPrefix(key, "cpu-vendor.node.kubevirt.io/") {
			covered["CPU vendor"]++
		} else {
			covered["machine type"]++
		}
	}
	if !in.Constrained() {
		covered["no added constraint"]++
	}
	for _, term := range in.AddedTerms {
		if len(term.MatchExpressions)+len(term.MatchFields) == 0 {
			covered["empty added term"]++
		}
	}
	if exactFit(in, d) {
		covered["exact fit"]++
	}
	for _, node := range in.Nodes {
		if d.Checks[node.Name] < reference.TargetNoRoom {
			continue
		}
		running := 0
		for _, pod := range in.Pods {
			if pod.Spec.NodeName == node.Name && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
				running++
			}
		}
		if pods := node.Status.Allocatable[corev1.ResourcePods]; int64(running) >= pods.Value() {
			covered["node with no room for another pod"]++
		}
		if _, ok := node.Status.Allocatable[targetDevice]; !ok && in.SourcePod != nil && reference.PodRequest(in.SourcePod, targetDevice) > 0 {
			covered["node without the device the launcher pod requests"]++
		}
	}
	if len(in.ClusterNodeSelectors) > 0 {
		covered["KubeVirt CR nodeSelectors"]++
	}
	if in.SourcePod != nil {
		podShape(covered, "source pod", in.SourcePod)
		if in.SourcePod.Spec.NodeSelector["kubevirt.io/cpumanager"] != "" {
			covered["dedicated CPUs from the source pod"]++
		}
		if d.Reason == reference.TargetNoCapacity {
			covered["no room for the launcher pod"]++
		}
	}
	for i := range in.Pods {
		podShape(covered, "pod", &in.Pods[i])
	}
}

// exactFit tells whether a node judged on its room has exactly the target pod's request free
// of some resource.
func exactFit(in reference.TargetInput, d reference.TargetDecision) bool {
	requests := map[corev1.ResourceName]int64{}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if in.SourcePod != nil {
			requests[r] = reference.PodRequest(in.SourcePod, r)
		} else if q, ok := in.VMI.Spec.Domain.Resources.Requests[r]; ok {
			requests[r] = amountOf(r, q)
		}
	}
	for _, node := range in.Nodes {
		if d.Checks[node.Name] < reference.TargetNoRoom {
			continue
		}
		for r, request := range requests {
			allocatable, ok := node.Status.Allocatable[r]
			if !ok || request == 0 {
				continue
			}
			free := amountOf(r, allocatable)
			for _, pod := range in.Pods {
				if pod.Spec.NodeName != node.Name || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
					continue
				}
				free -= reference.PodRequest(&pod, r)
			}
			if free == request {
				return true
			}
		}
	}
	return false
}

func amountOf(r corev1.ResourceName, q resource.Quantity) int64 {
	if r == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// podShape counts what a pod's request was made of beyond its containers.
func podShape(covered map[string]int, what string, pod *corev1.Pod) {
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		var containers int64
		for _, c := range pod.Spec.Containers {
			if q, ok := c.Resources.Requests[r]; ok {
				containers += amountOf(r, q)
			}
		}
		if got := reference.PodRequest(pod, r); got > containers {
			covered[what+" requests more than its containers"]++
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil {
			covered[what+" with a sidecar"]++
		}
	}
	if pod.Spec.Resources != nil {
		covered[what+" with pod-level requests"]++
	}
}

// Generated inputs. -----------------------------------------------------------------------

// Small pools, so that requirements, selectors, taints and tolerations often meet. The
// integer-valued labels serve Gt and Lt.
var (
	targetLabels = map[string][]string{
		"zone":             {"a", "b", "c"},
		"disktype":         {"ssd", "hdd"},
		"gpu":              {"true", "false"},
		"example.com/rack": {"1", "2", "3", "4"},
		"cores":            {"2", "4", "8", "16", "032", "-1", "+8"},
	}
	targetLabelKeys   = slices.Sorted(maps.Keys(targetLabels))
	targetMissingKey  = "example.com/absent"
	targetIntegers    = []string{"-2", "0", "3", "4", "8", "010", "+16"}
	targetCPUModels   = []string{"Haswell", "Skylake", "Icelake"}
	targetCPUFeatures = [][]string{{"avx2"}, {"avx2", "avx512"}, {"avx2", "avx512", "vaes"}}
	targetTaints      = []map[string]any{
		{"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
		{"key": "dedicated", "value": "db", "effect": "NoExecute"},
		{"key": "maintenance", "effect": "NoExecute"},
		{"key": "gpu", "value": "true", "effect": "PreferNoSchedule"},
		{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
	}
	targetTolerations = []map[string]any{
		{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"},
		{"key": "dedicated", "operator": "Exists"},
		{"key": "dedicated", "value": "db"},
		{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"},
		{"key": "maintenance", "operator": "Equal"},
		{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
		{"operator": "Exists"},
	}
	targetVendors      = []string{"Intel", "AMD"}
	targetMachineTypes = []string{"q35", "pc-q35-rhel9.6.0", "pc-q35-rhel8.6.0"}
	targetNodeCPU      = []string{"2", "4", "8", "3500m", "1500m"}
	targetNodeMemory   = []string{"4Gi", "8Gi", "16Gi", "6144Mi", "8G"}
	targetVMICPU       = []string{"100m", "500m", "1", "2", "1500m", "4"}
	targetVMIMemory    = []string{"512Mi", "1Gi", "2Gi", "4Gi", "1536Mi", "8Gi"}
	targetPodCPU       = []string{"100m", "250m", "500m", "1", "2"}
	targetPodMemory    = []string{"256Mi", "512Mi", "1Gi", "2Gi", "500M"}
	// The launcher's compute container: a VMI's memory plus KubeVirt's overhead.
	targetLauncherMemory = []string{"700Mi", "1330Mi", "2330Mi", "4450Mi", "8500Mi"}
	targetOverheadCPU    = []string{"100m", "250m", "1"}
	targetOverheadMemory = []string{"120Mi", "160Mi", "1Gi"}
	targetPodPhases      = []string{"Running", "Running", "Pending", "Succeeded", "Failed", ""}
	targetMissingNodes   = []string{"node-98", "node-99"}
)

type targetGen struct {
	r                       *rand.Rand
	nodeCPU, vmiCPU, podCPU []string
	names                   []string // the current case's node names
	node                    string   // the VMI's node in the current case, "" if none
}

func newTargetGen(seed uint64, hardQuantities bool) *targetGen {
	g := &targetGen{r: rand.New(rand.NewPCG(seed, 1)), nodeCPU: targetNodeCPU, vmiCPU: targetVMICPU, podCPU: targetPodCPU}
	if hardQuantities {
		g.nodeCPU = append(slices.Clone(g.nodeCPU), "500m", "900m", "1100m")
		g.vmiCPU = append(slices.Clone(g.vmiCPU), "200m", "300m", "400m", "250001u")
		g.podCPU = append(slices.Clone(g.podCPU), "100m", "200m", "300m", "300m", "100000u", "200000000n")
	}
	return g
}

func (g *targetGen) chance(n int) bool { return g.r.IntN(n) == 0 }

func (g *targetGen) newCase(i int) targetCase {
	n := 3 + g.r.IntN(28)
	g.names = make([]string, n)
	for j := range g.names {
		g.names[j] = fmt.Sprintf("node-%d", j+1)
	}
	switch x := g.r.IntN(10); {
	case x < 8:
		g.node = oneOf(g.r, g.names)
	case x < 9:
		g.node = oneOf(g.r, targetMissingNodes)
	default:
		g.node = ""
	}
	nodes := make([]any, n)
	for j, name := range g.names {
		nodes[j] = g.nodeObject(name)
	}
	var pods []any
	busy := 1 + g.r.IntN(3) // pods per node, on average
	for j := range g.r.IntN(busy*n + 1) {
		pods = append(pods, g.pod(j))
	}
	c := targetCase{
		"migration": g.migration(i),
		"vmi":       g.vmi(),
		"nodes":     nodes,
		"pods":      pods,
	}
	if g.chance(3) {
		c["sourcePod"] = g.sourcePod()
	}
	// a KubeVirt CR whose cluster-wide nodeSelectors name one of the nodes' labels
	if g.chance(4) {
		key := oneOf(g.r, targetLabelKeys)
		c["kubevirt"] = map[string]any{"spec": map[string]any{"configuration": map[string]any{
			"developerConfiguration": map[string]any{"nodeSelectors": map[string]any{key: oneOf(g.r, targetLabels[key])}},
		}}}
	}
	return c
}

func (g *targetGen) nodeObject(name string) map[string]any {
	labels := map[string]any{}
	for _, key := range targetLabelKeys {
		if !g.chance(3) {
			labels[key] = oneOf(g.r, targetLabels[key])
		}
	}
	// virt-handler labels a node with the CPU manager on.
	if g.chance(2) {
		labels["kubevirt.io/cpumanager"] = "true"
	}
	// The node labeller marks a host-model CPU obsolete, rarely.
	if g.chance(15) {
		labels["node-labeller.kubevirt.io/obsolete-host-model"] = "true"
	}
	// The kubelet's architecture label, mostly amd64.
	if !g.chance(10) {
		labels["kubernetes.io/arch"] = oneOf(g.r, []string{"amd64", "amd64", "amd64", "arm64"})
	}
	// virt-handler labels its node kubevirt.io/schedulable=true; now and then a node is marked
	// false, has no label (no virt-handler) or another value.
	switch x := g.r.IntN(24); {
	case x < 2:
		labels["kubevirt.io/schedulable"] = "false"
	case x < 4:
	case x < 5:
		labels["kubevirt.io/schedulable"] = "yes"
	default:
		labels["kubevirt.io/schedulable"] = "true"
	}
	// A CPU generation: the host-model CPU it offers and the models and features it takes.
	// Now and then a label is off, so that nodes of one generation differ.
	if gen := g.r.IntN(len(targetCPUModels) + 1); gen < len(targetCPUModels) {
		labels["host-model-cpu.node.kubevirt.io/"+targetCPUModels[gen]] = "true"
		for _, f := range targetCPUFeatures[gen] {
			if !g.chance(3) {
				labels["host-model-required-features.node.kubevirt.io/"+f] = "true"
			}
			labels["cpu-feature.node.kubevirt.io/"+f] = "true"
		}
		for _, model := range targetCPUModels[:gen+1] {
			labels["cpu-model-migration.node.kubevirt.io/"+model] = "true"
			labels["cpu-model.node.kubevirt.io/"+model] = "true"
		}
		if g.chance(6) {
			keys := slices.Sorted(maps.Keys(labels))
			labels[oneOf(g.r, keys)] = "false"
		}
	}
	// KubeVirt's node labeller: the CPU vendor (now and then none, rarely two) and the
	// machine types the node's QEMU supports.
	if !g.chance(5) {
		labels["cpu-vendor.node.kubevirt.io/"+oneOf(g.r, targetVendors)] = "true"
		if g.chance(30) {
			labels["cpu-vendor.node.kubevirt.io/"+oneOf(g.r, targetVendors)] = "true"
		}
	}
	for _, machine := range targetMachineTypes {
		if !g.chance(4) {
			labels["machine-type.node.kubevirt.io/"+machine] = oneOf(g.r, []string{"true", "true", "true", "false"})
		}
	}
	spec := map[string]any{}
	if g.chance(10) {
		spec["unschedulable"] = true
	}
	var taints []any
	for range g.r.IntN(3) {
		if g.chance(2) {
			taints = append(taints, maps.Clone(oneOf(g.r, targetTaints)))
		}
	}
	if len(taints) > 0 {
		spec["taints"] = taints
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata":   map[string]any{"name": name, "labels": labels},
		"spec":       spec,
		"status":     map[string]any{"allocatable": g.allocatable()},
	}
}

// targetDevice is a device plugin's resource KubeVirt's launcher pod requests.
const targetDevice = "devices.kubevirt.io/kvm"

// allocatable is a node's: now and then room for few pods, and no or few KVM devices.
func (g *targetGen) allocatable() map[string]any {
	a := map[string]any{
		"cpu":    oneOf(g.r, g.nodeCPU),
		"memory": oneOf(g.r, targetNodeMemory),
		"pods":   oneOf(g.r, []string{"110", "110", "110", "1", "2"}),
	}
	if !g.chance(4) {
		a[targetDevice] = oneOf(g.r, []string{"1k", "1k", "1", "2"})
	}
	return a
}

// sourcePod is the VMI's launcher pod: its nodeSelector has KubeVirt's schedulable label and,
// for a VMI that migrated before, the CPU entries of the node it first started on.
func (g *targetGen) sourcePod() map[string]any {
	selector := map[string]any{"kubevirt.io/schedulable": "true"}
	if g.chance(2) {
		gen := g.r.IntN(len(targetCPUModels))
		selector["cpu-model-migration.node.kubevirt.io/"+targetCPUModels[gen]] = "true"
		for _, f := range targetCPUFeatures[gen] {
			if g.chance(2) {
				selector["cpu-feature.node.kubevirt.io/"+f] = "true"
			}
		}
	}
	if g.chance(2) {
		selector["kubernetes.io/arch"] = oneOf(g.r, []string{"amd64", "arm64"})
	}
	// a VMI with dedicated CPUs; a previous migration's addedNodeSelector
	if g.chance(4) {
		selector["kubevirt.io/cpumanager"] = "true"
	}
	if g.chance(6) {
		selector[targetLabelKeys[0]] = oneOf(g.r, targetLabels[targetLabelKeys[0]])
	}
	spec := map[string]any{"nodeName": g.node, "nodeSelector": selector}
	if !g.chance(6) {
		// the compute container (the VMI's requests with KubeVirt's overhead), now and then
		// KubeVirt's guest-console-log sidecar, container disk init containers, a runtime
		// class's overhead
		maps.Copy(spec, g.podResources(1, true))
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"namespace": "default", "name": "virt-launcher-vmi"},
		"spec":       spec,
	}
}

// podResources is a pod spec's containers, init containers, overhead and, for other pods than
// the launcher, now and then pod-level requests.
func (g *targetGen) podResources(containers int, launcher bool) map[string]any {
	spec := map[string]any{}
	cpus, memories := g.podCPU, targetPodMemory
	if launcher {
		cpus, memories = g.vmiCPU, targetLauncherMemory
	}
	var list []any
	for range containers {
		list = append(list, map[string]any{"name": "c", "resources": map[string]any{"requests": g.requests(cpus, memories)}})
	}
	if (launcher && !g.chance(3)) || (!launcher && g.chance(4)) {
		list[0].(map[string]any)["resources"].(map[string]any)["requests"].(map[string]any)[targetDevice] = "1"
	}
	spec["containers"] = list
	if g.chance(3) {
		var inits []any
		for range 1 + g.r.IntN(3) {
			init := map[string]any{"name": "i", "resources": map[string]any{"requests": g.requests(g.podCPU, targetPodMemory)}}
			if g.chance(3) {
				init["restartPolicy"] = "Always"
			}
			inits = append(inits, init)
		}
		spec["initContainers"] = inits
	}
	if g.chance(5) {
		spec["overhead"] = g.requests(targetOverheadCPU, targetOverheadMemory)
	}
	if !launcher && g.chance(12) {
		spec["resources"] = map[string]any{"requests": g.requests(g.podCPU, targetPodMemory)}
	}
	return spec
}

// requests draws a CPU and a memory request, each left out now and then.
func (g *targetGen) requests(cpus, memories []string) map[string]any {
	requests := map[string]any{}
	if !g.chance(5) {
		requests["cpu"] = oneOf(g.r, cpus)
	}
	if !g.chance(5) {
		requests["memory"] = oneOf(g.r, memories)
	}
	return requests
}

func (g *targetGen) pod(i int) map[string]any {
	spec := map[string]any{}
	switch x := g.r.IntN(20); {
	case x < 18:
		spec["nodeName"] = oneOf(g.r, g.names)
	case x < 19:
		spec["nodeName"] = oneOf(g.r, targetMissingNodes)
	}
	maps.Copy(spec, g.podResources(1+g.r.IntN(2), false))
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"namespace": "default", "name": fmt.Sprintf("pod-%d", i)},
		"spec":       spec,
	}
	if phase := oneOf(g.r, targetPodPhases); phase != "" {
		pod["status"] = map[string]any{"phase": phase}
	}
	return pod
}

func (g *targetGen) vmi() map[string]any {
	spec := map[string]any{}
	if g.chance(3) {
		selector := map[string]any{}
		for range 1 + g.r.IntN(2) {
			key := oneOf(g.r, targetLabelKeys)
			selector[key] = oneOf(g.r, targetLabels[key])
		}
		if g.chance(8) {
			selector["cpu-vendor.node.kubevirt.io/"+oneOf(g.r, targetVendors)] = "true"
		}
		spec["nodeSelector"] = selector
	}
	nodeAffinity := map[string]any{}
	if g.chance(2) {
		var terms []any
		for range 1 + g.r.IntN(3) {
			terms = append(terms, g.term(false))
		}
		nodeAffinity["requiredDuringSchedulingIgnoredDuringExecution"] = map[string]any{"nodeSelectorTerms": terms}
	}
	if g.chance(5) {
		nodeAffinity["preferredDuringSchedulingIgnoredDuringExecution"] = []any{
			map[string]any{"weight": int64(1 + g.r.IntN(100)), "preference": g.term(false)},
		}
	}
	if len(nodeAffinity) > 0 || g.chance(20) {
		spec["affinity"] = map[string]any{"nodeAffinity": nodeAffinity}
	}
	var tolerations []any
	for range g.r.IntN(4) {
		tol := oneOf(g.r, targetTolerations)
		if tol["key"] == nil && !g.chance(4) {
			continue // tolerating everything, rarely
		}
		tolerations = append(tolerations, maps.Clone(tol))
	}
	if len(tolerations) > 0 {
		spec["tolerations"] = tolerations
	}
	domain := map[string]any{}
	requests := map[string]any{}
	if !g.chance(5) {
		requests["cpu"] = oneOf(g.r, g.vmiCPU)
	}
	if !g.chance(5) {
		requests["memory"] = oneOf(g.r, targetVMIMemory)
	}
	domain["resources"] = map[string]any{"requests": requests}
	switch x := g.r.IntN(20); {
	case x < 10: // no CPU model: host-model
	case x < 12:
		domain["cpu"] = map[string]any{"model": ""}
	case x < 15:
		domain["cpu"] = map[string]any{"model": "host-model"}
	default:
		domain["cpu"] = map[string]any{"model": "Haswell"}
	}
	// CPU features of every policy, now and then.
	if g.chance(3) {
		var features []any
		for range 1 + g.r.IntN(2) {
			f := map[string]any{"name": oneOf(g.r, targetCPUFeatures[len(targetCPUFeatures)-1])}
			if policy := oneOf(g.r, []string{"", "require", "require", "force", "disable", "optional", "forbid"}); policy != "" {
				f["policy"] = policy
			}
			features = append(features, f)
		}
		cpu, _ := domain["cpu"].(map[string]any)
		if cpu == nil {
			cpu = map[string]any{}
			domain["cpu"] = cpu
		}
		cpu["features"] = features
	}
	if g.chance(2) {
		domain["machine"] = map[string]any{"type": oneOf(g.r, targetMachineTypes)}
	}
	spec["domain"] = domain
	if !g.chance(3) {
		spec["architecture"] = oneOf(g.r, []string{"amd64", "amd64", "arm64", "AMD64"})
	}
	status := map[string]any{}
	if g.chance(3) {
		status["machine"] = map[string]any{"type": oneOf(g.r, targetMachineTypes)}
	}
	vmi := map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "VirtualMachineInstance",
		"metadata":   map[string]any{"namespace": "default", "name": "vmi"},
		"spec":       spec,
	}
	if g.node != "" {
		status["nodeName"] = g.node
	}
	if len(status) > 0 {
		vmi["status"] = status
	}
	return vmi
}

// term is a well-formed NodeSelectorTerm: label requirements and, now and then, a node name;
// an added term names a node more often (design 001's main use).
func (g *targetGen) term(added bool) map[string]any {
	term := map[string]any{}
	if added && g.chance(30) {
		return term // no requirements: matches no node
	}
	var expressions, fields []any
	named := added && g.chance(2)
	if !named || g.chance(4) {
		expressions = append(expressions, g.expression())
		for !added && g.chance(2) {
			expressions = append(expressions, g.expression())
		}
	}
	if named || g.chance(6) {
		fields = append(fields, g.nameRequirement())
		if g.chance(8) {
			fields = append(fields, g.nameRequirement())
		}
	}
	if len(expressions) > 0 {
		term["matchExpressions"] = expressions
	}
	if len(fields) > 0 {
		term["matchFields"] = fields
	}
	return term
}

func (g *targetGen) expression() map[string]any {
	key := oneOf(g.r, targetLabelKeys)
	if g.chance(20) {
		key = targetMissingKey
	}
	values := func() []any {
		pool := targetLabels[key]
		if pool == nil {
			pool = []string{"x"}
		}
		out := []any{oneOf(g.r, pool)}
		if g.chance(3) {
			out = append(out, oneOf(g.r, pool))
		}
		return out
	}
	switch op := oneOf(g.r, []string{"In", "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}); op {
	case "In", "NotIn":
		return map[string]any{"key": key, "operator": op, "values": values()}
	case "Gt", "Lt":
		if !g.chance(8) { // else a label that is no integer, or none
			key = oneOf(g.r, []string{"cores", "example.com/rack"})
		}
		return map[string]any{"key": key, "operator": op, "values": []any{oneOf(g.r, targetIntegers)}}
	default:
		return map[string]any{"key": key, "operator": op}
	}
}

// nameRequirement names an existing node, a missing one or the VMI's node.
func (g *targetGen) nameRequirement() map[string]any {
	var name string
	switch x := g.r.IntN(10); {
	case x < 5:
		name = oneOf(g.r, g.names)
	case x < 7:
		name = oneOf(g.r, targetMissingNodes)
	default:
		name = g.node
		if name == "" {
			name = oneOf(g.r, g.names)
		}
	}
	op := "In"
	if g.chance(5) {
		op = "NotIn"
	}
	return map[string]any{"key": "metadata.name", "operator": op, "values": []any{name}}
}

// migration adds a constraint from any of the three sources, now and then none.
func (g *targetGen) migration(i int) map[string]any {
	metadata := map[string]any{"namespace": "default", "name": fmt.Sprintf("migration-%d", i)}
	spec := map[string]any{"vmiName": "vmi"}
	shaped := func(term map[string]any) any {
		if g.chance(4) {
			return []any{term}
		}
		return term
	}
	if g.r.IntN(10) < 6 {
		spec["addedNodeSelectorTerm"] = shaped(g.term(true))
	}
	if g.chance(4) {
		raw, err := json.Marshal(shaped(g.term(true)))
		if err != nil {
			panic(err)
		}
		metadata["annotations"] = map[string]any{
			reference.AddedNodeSelectorTermAnnotation: string(raw),
			"example.com/note":                        "unrelated",
		}
	}
	if g.chance(4) {
		selector := map[string]any{}
		for range g.r.IntN(3) { // sometimes empty: adds nothing
			key := oneOf(g.r, targetLabelKeys)
			selector[key] = oneOf(g.r, targetLabels[key])
		}
		spec["addedNodeSelector"] = selector
	}
	return map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "VirtualMachineInstanceMigration",
		"metadata":   metadata,
		"spec":       spec,
	}
}
