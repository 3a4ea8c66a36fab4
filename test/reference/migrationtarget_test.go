package reference

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Design 001's functional tests, decided by hand on this cluster: three nodes with 4 CPUs and
// 8Gi each, node-1 and node-2 with SSDs, node-3 with an HDD, and a VMI requesting 1 CPU and 2Gi
// that runs on node-1.

func targetObject(obj map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: obj}
}

// targetNode carries kubevirt.io/schedulable=true, as virt-handler labels its node, unless the
// labels set it.
func targetNode(name string, labels map[string]any, cpu, memory string) *unstructured.Unstructured {
	labels = maps.Clone(labels)
	if labels == nil {
		labels = map[string]any{}
	}
	if _, ok := labels["kubevirt.io/schedulable"]; !ok {
		labels["kubevirt.io/schedulable"] = "true"
	}
	return targetObject(map[string]any{
		"metadata": map[string]any{"name": name, "labels": labels},
		"status":   map[string]any{"allocatable": map[string]any{"cpu": cpu, "memory": memory}},
	})
}

func targetCluster() []*unstructured.Unstructured {
	return []*unstructured.Unstructured{
		targetNode("node-1", map[string]any{"disktype": "ssd"}, "4", "8Gi"),
		targetNode("node-2", map[string]any{"disktype": "ssd"}, "4", "8Gi"),
		targetNode("node-3", map[string]any{"disktype": "hdd"}, "4", "8Gi"),
	}
}

func targetVMI(spec map[string]any) *unstructured.Unstructured {
	// host-passthrough: no host-model CPU requirement, so the nodes need no CPU labels.
	s := map[string]any{"domain": map[string]any{"cpu": map[string]any{"model": "host-passthrough"}, "resources": map[string]any{"requests": map[string]any{"cpu": "1", "memory": "2Gi"}}}}
	for k, v := range spec {
		s[k] = v
	}
	return targetObject(map[string]any{
		"metadata": map[string]any{"namespace": "default", "name": "vmi-fedora"},
		"spec":     s,
		"status":   map[string]any{"nodeName": "node-1"},
	})
}

// targetNamed is the design's term: the node named name.
func targetNamed(name string) map[string]any {
	return map[string]any{"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{name}}}}
}

func targetMigration(spec map[string]any) *unstructured.Unstructured {
	s := map[string]any{"vmiName": "vmi-fedora"}
	for k, v := range spec {
		s[k] = v
	}
	return targetObject(map[string]any{"metadata": map[string]any{"namespace": "default", "name": "migration-job"}, "spec": s})
}

func decideTarget(t *testing.T, migration, vmi *unstructured.Unstructured, nodes, pods []*unstructured.Unstructured) TargetDecision {
	t.Helper()
	in, err := TargetInputFromUnstructured(migration, vmi, nodes, pods)
	if err != nil {
		t.Fatal(err)
	}
	return MigrationTarget(in)
}

func wantTarget(t *testing.T, d TargetDecision, candidates []string, reason string) {
	t.Helper()
	if !slices.Equal(d.Candidates, candidates) || d.Reason != reason {
		t.Errorf("got candidates %v, reason %q; want %v, %q", d.Candidates, d.Reason, candidates, reason)
	}
}

func affinityJSON(t *testing.T, a *corev1.NodeAffinity) string {
	t.Helper()
	raw, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

const namedNode2Affinity = `{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-2"]}]}]}}`

// Positive test 1: the named node can take the VM.
func TestTargetMigratesToTheNamedNode(t *testing.T) {
	d := decideTarget(t, targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-2")}), targetVMI(nil), targetCluster(), nil)
	wantTarget(t, d, []string{"node-2"}, "")
	if got := affinityJSON(t, d.Affinity); got != namedNode2Affinity {
		t.Errorf("target affinity %s, want %s", got, namedNode2Affinity)
	}
}

// Negative test 1: the named node fits but lacks the VM's nodeSelector label.
func TestTargetNamedNodeConflictsWithTheVMsNodeSelector(t *testing.T) {
	vmi := targetVMI(map[string]any{"nodeSelector": map[string]any{"disktype": "hdd"}})
	d := decideTarget(t, targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-2")}), vmi, targetCluster(), nil)
	wantTarget(t, d, []string{}, TargetConflictsWithVMConstraints)
	if d.Checks["node-2"] != TargetConflicts {
		t.Errorf("node-2 stopped at check %d, want %d", d.Checks["node-2"], TargetConflicts)
	}
}

// Negative test 2: the named node does not exist.
func TestTargetNamedNodeDoesNotExist(t *testing.T) {
	d := decideTarget(t, targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-9")}), targetVMI(nil), targetCluster(), nil)
	wantTarget(t, d, []string{}, TargetNodeNotFound)
}

// Negative test 3: the VM already runs on the named node.
func TestTargetVMAlreadyOnTheNamedNode(t *testing.T) {
	d := decideTarget(t, targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-1")}), targetVMI(nil), targetCluster(), nil)
	wantTarget(t, d, []string{}, TargetAlreadyOnNode)
}

// Negative test 4: the named node cannot accommodate the VM's launcher pod, by allocatable
// alone or with the requests of the pods already there.
func TestTargetNamedNodeCannotFitTheVM(t *testing.T) {
	migration := targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-2")})
	small := targetCluster()
	small[1] = targetNode("node-2", map[string]any{"disktype": "ssd"}, "4", "1Gi")
	d := decideTarget(t, migration, targetVMI(nil), small, nil)
	wantTarget(t, d, []string{}, TargetNoCapacity)
	if got := affinityJSON(t, d.Affinity); got != namedNode2Affinity {
		t.Errorf("target affinity %s, want %s (reported without a candidate too)", got, namedNode2Affinity)
	}

	pod := func(node, phase, cpu, memory string) *unstructured.Unstructured {
		return targetObject(map[string]any{
			"spec": map[string]any{"nodeName": node, "containers": []any{
				map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": cpu, "memory": memory}}},
			}},
			"status": map[string]any{"phase": phase},
		})
	}
	// 3 of 4 CPUs and 6 of 8Gi used leave exactly the VMI's 1 CPU and 2Gi.
	exact := []*unstructured.Unstructured{pod("node-2", "Running", "2500m", "5Gi"), pod("node-2", "Pending", "500m", "1Gi"), pod("node-2", "Succeeded", "4", "8Gi")}
	wantTarget(t, decideTarget(t, migration, targetVMI(nil), targetCluster(), exact), []string{"node-2"}, "")
	over := append(exact, pod("node-2", "Running", "1m", "0"))
	wantTarget(t, decideTarget(t, migration, targetVMI(nil), targetCluster(), over), []string{}, TargetNoCapacity)
}

// Without an added constraint every other node that can take the VM is a candidate, and the
// target keeps the VMI's affinity; ORed VMI terms each get the added term ANDed in.
func TestTargetAffinityIsThePureAnd(t *testing.T) {
	d := decideTarget(t, targetMigration(nil), targetVMI(nil), targetCluster(), nil)
	wantTarget(t, d, []string{"node-2", "node-3"}, "")
	if d.Affinity != nil {
		t.Errorf("target affinity %s, want none", affinityJSON(t, d.Affinity))
	}

	zone := func(z string) map[string]any {
		return map[string]any{"matchExpressions": []any{map[string]any{"key": "zone", "operator": "In", "values": []any{z}}}}
	}
	vmi := targetVMI(map[string]any{"affinity": map[string]any{"nodeAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{zone("a"), zone("b")}},
	}}})
	nodes := []*unstructured.Unstructured{
		targetNode("node-1", map[string]any{"zone": "a", "disktype": "ssd"}, "4", "8Gi"),
		targetNode("node-2", map[string]any{"zone": "a", "disktype": "ssd"}, "4", "8Gi"),
		targetNode("node-3", map[string]any{"zone": "b", "disktype": "hdd"}, "4", "8Gi"),
		targetNode("node-4", map[string]any{"zone": "b", "disktype": "ssd"}, "4", "8Gi"),
		targetNode("node-5", map[string]any{"zone": "c", "disktype": "ssd"}, "4", "8Gi"),
	}
	migration := targetMigration(map[string]any{"addedNodeSelector": map[string]any{"disktype": "ssd"}})
	d = decideTarget(t, migration, vmi, nodes, nil)
	wantTarget(t, d, []string{"node-2", "node-4"}, "")
	want := `{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[` +
		`{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]},{"key":"disktype","operator":"In","values":["ssd"]}]},` +
		`{"matchExpressions":[{"key":"zone","operator":"In","values":["b"]},{"key":"disktype","operator":"In","values":["ssd"]}]}]}}`
	if got := affinityJSON(t, d.Affinity); got != want {
		t.Errorf("target affinity %s, want %s", got, want)
	}
}

// The three sources are ANDed; an empty term adds no constraint (design 001: "empty by
// default (all Nodes match)").
func TestTargetSources(t *testing.T) {
	nodes := []*unstructured.Unstructured{
		targetNode("node-1", map[string]any{}, "4", "8Gi"),
		targetNode("node-2", map[string]any{"disktype": "ssd", "zone": "a", "cores": "16"}, "4", "8Gi"),
		targetNode("node-3", map[string]any{"disktype": "ssd", "zone": "b", "cores": "16"}, "4", "8Gi"),
		targetNode("node-4", map[string]any{"disktype": "ssd", "zone": "a", "cores": "8"}, "4", "8Gi"),
	}
	migration := targetMigration(map[string]any{
		"addedNodeSelectorTerm": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "disktype", "operator": "In", "values": []any{"ssd"}}}}},
		"addedNodeSelector":     map[string]any{"zone": "a"},
	})
	migration.SetAnnotations(map[string]string{AddedNodeSelectorTermAnnotation: `{"matchExpressions":[{"key":"cores","operator":"Gt","values":["08"]}]}`})
	wantTarget(t, decideTarget(t, migration, targetVMI(nil), nodes, nil), []string{"node-2"}, "")

	empty := targetMigration(map[string]any{"addedNodeSelectorTerm": map[string]any{}, "addedNodeSelector": map[string]any{"zone": "a"}})
	wantTarget(t, decideTarget(t, empty, targetVMI(nil), nodes, nil), []string{"node-2", "node-4"}, "")
}

// Taints the VM does not tolerate conflict; cordoned nodes are unschedulable whatever the VM
// tolerates; host-model VMs need the source node's CPU model and required features.
func TestTargetTaintsCordonsAndHostModel(t *testing.T) {
	nodes := targetCluster()
	unstructured.SetNestedSlice(nodes[1].Object, []any{map[string]any{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}}, "spec", "taints")
	unstructured.SetNestedField(nodes[2].Object, true, "spec", "unschedulable")
	d := decideTarget(t, targetMigration(nil), targetVMI(nil), nodes, nil)
	wantTarget(t, d, []string{}, TargetNoMatchingNode) // node-2 conflicts, node-3 is cordoned
	tolerating := targetVMI(map[string]any{"tolerations": []any{
		map[string]any{"key": "dedicated", "operator": "Exists"},
		map[string]any{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
	}})
	wantTarget(t, decideTarget(t, targetMigration(nil), tolerating, nodes, nil), []string{"node-2"}, "")

	cpu := []*unstructured.Unstructured{
		targetNode("node-1", map[string]any{"host-model-cpu.node.kubevirt.io/Skylake": "true", "host-model-required-features.node.kubevirt.io/avx512": "true"}, "4", "8Gi"),
		targetNode("node-2", map[string]any{"cpu-model-migration.node.kubevirt.io/Skylake": "true", "cpu-feature.node.kubevirt.io/avx512": "true"}, "4", "8Gi"),
		targetNode("node-3", map[string]any{"cpu-model-migration.node.kubevirt.io/Skylake": "true"}, "4", "8Gi"),
	}
	hostModel := targetVMI(map[string]any{"domain": map[string]any{"cpu": map[string]any{"model": "host-model"}}})
	wantTarget(t, decideTarget(t, targetMigration(nil), hostModel, cpu, nil), []string{"node-2"}, "")
	// A named model: no host-model requirement, but cpu-model.node.kubevirt.io/<model>, and
	// the features it requires and forbids.
	named := targetVMI(map[string]any{"domain": map[string]any{"cpu": map[string]any{"model": "Haswell"}}})
	wantTarget(t, decideTarget(t, targetMigration(nil), named, cpu, nil), []string{}, TargetConflictsWithVMConstraints)
	haswellNodes := []*unstructured.Unstructured{cpu[0]}
	for _, n := range cpu[1:] {
		n = n.DeepCopy()
		l := n.GetLabels()
		l["cpu-model.node.kubevirt.io/Haswell"] = "true"
		n.SetLabels(l)
		haswellNodes = append(haswellNodes, n)
	}
	wantTarget(t, decideTarget(t, targetMigration(nil), named, haswellNodes, nil), []string{"node-2", "node-3"}, "")
	featured := targetVMI(map[string]any{"domain": map[string]any{"cpu": map[string]any{"model": "Haswell", "features": []any{
		map[string]any{"name": "avx512", "policy": "require"}, map[string]any{"name": "vmx", "policy": "force"},
	}}}})
	wantTarget(t, decideTarget(t, targetMigration(nil), featured, haswellNodes, nil), []string{"node-2"}, "")
	forbidding := targetVMI(map[string]any{"domain": map[string]any{"cpu": map[string]any{"model": "Haswell", "features": []any{
		map[string]any{"name": "avx512", "policy": "forbid"},
	}}}})
	wantTarget(t, decideTarget(t, targetMigration(nil), forbidding, haswellNodes, nil), []string{"node-3"}, "")
	only3 := targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-3")})
	wantTarget(t, decideTarget(t, only3, hostModel, cpu, nil), []string{}, TargetConflictsWithVMConstraints)

	// A VMI that migrated before: its launcher pod's nodeSelector carries the CPU of the node
	// it started on, and binds the target instead of the current node's labels.
	migrated := targetObject(map[string]any{"spec": map[string]any{"nodeSelector": map[string]any{
		"kubevirt.io/schedulable": "true", "cpu-model-migration.node.kubevirt.io/Skylake": "true",
	}}})
	haswell := slices.Clone(cpu)
	haswell[0] = targetNode("node-1", map[string]any{"host-model-cpu.node.kubevirt.io/Haswell": "true"}, "4", "8Gi")
	in, err := TargetInputFromUnstructured(targetMigration(nil), hostModel, haswell, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantTarget(t, MigrationTarget(in), []string{}, TargetConflictsWithVMConstraints) // no node takes Haswell
	if err := in.SetSourcePod(migrated); err != nil {
		t.Fatal(err)
	}
	wantTarget(t, MigrationTarget(in), []string{"node-2", "node-3"}, "")

	// No host-model label on the VMI's node: virt-controller creates no target pod.
	bare := slices.Clone(cpu)
	bare[0] = targetNode("node-1", map[string]any{}, "4", "8Gi")
	wantTarget(t, decideTarget(t, targetMigration(nil), hostModel, bare, nil), []string{}, TargetConflictsWithVMConstraints)
}

// KubeVirt's target pod requires the source node's CPU vendor (virt-controller's
// createTargetPod; upstream "should add CPU vendor label from source node": Intel, AMD, none)
// unless the VMI's nodeSelector names a vendor, and the VMI's machine type, status before spec
// ("should add node selector for machine type").
func TestTargetCPUVendorAndMachineType(t *testing.T) {
	vendor := func(v string) map[string]any {
		if v == "" {
			return map[string]any{}
		}
		return map[string]any{"cpu-vendor.node.kubevirt.io/" + v: "true"}
	}
	cluster := func(source string) []*unstructured.Unstructured {
		return []*unstructured.Unstructured{
			targetNode("node-1", vendor(source), "4", "8Gi"),
			targetNode("node-2", vendor("Intel"), "4", "8Gi"),
			targetNode("node-3", vendor("AMD"), "4", "8Gi"),
		}
	}
	wantTarget(t, decideTarget(t, targetMigration(nil), targetVMI(nil), cluster("Intel"), nil), []string{"node-2"}, "")
	wantTarget(t, decideTarget(t, targetMigration(nil), targetVMI(nil), cluster("AMD"), nil), []string{"node-3"}, "")
	wantTarget(t, decideTarget(t, targetMigration(nil), targetVMI(nil), cluster(""), nil), []string{"node-2", "node-3"}, "")
	own := targetVMI(map[string]any{"nodeSelector": vendor("AMD")})
	wantTarget(t, decideTarget(t, targetMigration(nil), own, cluster("Intel"), nil), []string{"node-3"}, "")
	wantTarget(t, decideTarget(t, targetMigration(map[string]any{"addedNodeSelectorTerm": targetNamed("node-3")}), targetVMI(nil), cluster("Intel"), nil),
		[]string{}, TargetConflictsWithVMConstraints)

	machines := []*unstructured.Unstructured{
		targetNode("node-1", map[string]any{}, "4", "8Gi"),
		targetNode("node-2", map[string]any{"machine-type.node.kubevirt.io/q35": "true"}, "4", "8Gi"),
		targetNode("node-3", map[string]any{"machine-type.node.kubevirt.io/pc-q35-rhel9.6.0": "true"}, "4", "8Gi"),
	}
	vmi := targetVMI(map[string]any{"domain": map[string]any{"cpu": map[string]any{"model": "host-passthrough"}, "machine": map[string]any{"type": "q35"}}})
	wantTarget(t, decideTarget(t, targetMigration(nil), vmi, machines, nil), []string{"node-2"}, "")
	unstructured.SetNestedField(vmi.Object, "pc-q35-rhel9.6.0", "status", "machine", "type")
	wantTarget(t, decideTarget(t, targetMigration(nil), vmi, machines, nil), []string{"node-3"}, "")

	// The VMI's node must be given: its labels bind the target.
	wantTarget(t, decideTarget(t, targetMigration(nil), targetVMI(nil), cluster("Intel")[1:], nil), []string{}, TargetInvalidInput)
}
