package engine_test

import (
	"context"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The migration target decision against facts read from KubeVirt's own unit tests of the
// target pod virt-controller creates (v1.8.0 and v1.9.0 alike):
// pkg/virt-controller/watch/migration/migration_test.go (createTargetPod) and
// pkg/virt-controller/services/template_test.go (NodeSelectorRenderer, memory overhead), and,
// for capacity, from how kube-scheduler counts a pod's requests: k8s.io/component-helpers
// resource/helpers_test.go (PodRequests) and kubernetes pkg/scheduler/framework/plugins/
// noderesources/fit.go (v1.35). The fixtures are this
// project's own. Each case is decided by the engine (the default bundle; this decision has no
// kubevirt-mode setting) and by the Go reference, and labelled with its class:
//   - agrees: virt-rules' candidates are the nodes the scheduler would accept for KubeVirt's
//     target pod;
//   - differs by documented choice: virt-rules answers otherwise on purpose (the reason is
//     in the case's note).

type upstreamTargetCase struct {
	name, class, upstream string // upstream: the upstream test the fact comes from
	note                  string
	in                    targetCase
	candidates            []string
	reason                string
}

// upstreamNode is a node with 4 CPUs and 8Gi and the given labels, and
// kubevirt.io/schedulable=true (as virt-handler labels its node) unless they set it.
func upstreamNode(name string, labels map[string]any) any {
	labels = maps.Clone(labels)
	if _, ok := labels["kubevirt.io/schedulable"]; !ok {
		labels["kubevirt.io/schedulable"] = "true"
	}
	return map[string]any{
		"metadata": map[string]any{"name": name, "labels": labels},
		"status":   map[string]any{"allocatable": map[string]any{"cpu": "4", "memory": "8Gi"}},
	}
}

// upstreamInput: a VMI requesting 1 CPU and 2Gi on node-1 (spec and status patched in), a
// migration with the given spec.
func upstreamInput(migrationSpec, vmiSpec, vmiStatus map[string]any, nodes ...any) targetCase {
	spec := domainWith(nil)
	maps.Copy(spec, vmiSpec)
	status := map[string]any{"nodeName": "node-1"}
	maps.Copy(status, vmiStatus)
	mspec := map[string]any{"vmiName": "vmi"}
	maps.Copy(mspec, migrationSpec)
	return targetCase{
		"migration": map[string]any{"metadata": map[string]any{"namespace": "default", "name": "m"}, "spec": mspec},
		"vmi":       map[string]any{"metadata": map[string]any{"namespace": "default", "name": "vmi"}, "spec": spec, "status": status},
		"nodes":     nodes,
	}
}

// unschedulableLabelled is an upstreamNode whose kubevirt.io/schedulable label has the value,
// or none for "".
func unschedulableLabelled(name, value string) any {
	node := upstreamNode(name, labels()).(map[string]any)
	l := node["metadata"].(map[string]any)["labels"].(map[string]any)
	delete(l, "kubevirt.io/schedulable")
	if value != "" {
		l["kubevirt.io/schedulable"] = value
	}
	return node
}

func labels(kv ...string) map[string]any {
	out := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func domainWith(extra map[string]any) map[string]any {
	// host-passthrough: as upstream's fixture VMIs without a CPU, no host-model requirement and
	// no CPU model label.
	domain := map[string]any{"cpu": map[string]any{"model": "host-passthrough"}, "resources": map[string]any{"requests": map[string]any{"cpu": "1", "memory": "2Gi"}}}
	maps.Copy(domain, extra)
	return map[string]any{"domain": domain}
}

const (
	intel = "cpu-vendor.node.kubevirt.io/Intel"
	amd   = "cpu-vendor.node.kubevirt.io/AMD"
)

func upstreamTargetCases() []upstreamTargetCase {
	vendorCluster := func(source ...string) []any {
		return []any{
			upstreamNode("node-1", labels(source...)),
			upstreamNode("node-2", labels(intel, "true")),
			upstreamNode("node-3", labels(amd, "true")),
			upstreamNode("node-4", labels()),
		}
	}
	machineCluster := []any{
		upstreamNode("node-1", labels()),
		upstreamNode("node-2", labels("machine-type.node.kubevirt.io/q35", "true")),
		upstreamNode("node-3", labels("machine-type.node.kubevirt.io/pc-q35-rhel9.6.0", "true")),
	}
	hostModel := domainWith(map[string]any{"cpu": map[string]any{"model": "host-model"}})
	noModel := map[string]any{"domain": map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "1", "memory": "2Gi"}}}}
	fake := func(source map[string]any) []any {
		return []any{
			upstreamNode("node-1", source),
			upstreamNode("node-2", labels("cpu-model-migration.node.kubevirt.io/fake", "true", "cpu-feature.node.kubevirt.io/fake", "true")),
			upstreamNode("node-3", labels("cpu-model-migration.node.kubevirt.io/fake", "true")),
			upstreamNode("node-4", labels("cpu-model-migration.node.kubevirt.io/first", "true", "cpu-feature.node.kubevirt.io/vmx", "true")),
		}
	}
	fakeSource := labels("host-model-cpu.node.kubevirt.io/fake", "true", "cpu-model-migration.node.kubevirt.io/fake", "true",
		"host-model-required-features.node.kubevirt.io/fake", "true")
	// Named CPU model Conroe: node-2 offers it, node-3 with lahf_lm and sse2, node-4 with
	// ssse3 too, node-5 the features but not the model.
	featureCluster := []any{
		upstreamNode("node-1", labels()),
		upstreamNode("node-2", labels("cpu-model.node.kubevirt.io/Conroe", "true")),
		upstreamNode("node-3", labels("cpu-model.node.kubevirt.io/Conroe", "true", "cpu-feature.node.kubevirt.io/lahf_lm", "true", "cpu-feature.node.kubevirt.io/sse2", "true")),
		upstreamNode("node-4", labels("cpu-model.node.kubevirt.io/Conroe", "true", "cpu-feature.node.kubevirt.io/lahf_lm", "true", "cpu-feature.node.kubevirt.io/sse2", "true", "cpu-feature.node.kubevirt.io/ssse3", "true")),
		upstreamNode("node-5", labels("cpu-feature.node.kubevirt.io/lahf_lm", "true", "cpu-feature.node.kubevirt.io/sse2", "true")),
	}
	archCluster := []any{
		upstreamNode("node-1", labels("kubernetes.io/arch", "amd64")),
		upstreamNode("node-2", labels("kubernetes.io/arch", "amd64")),
		upstreamNode("node-3", labels("kubernetes.io/arch", "arm64")),
		upstreamNode("node-4", labels()),
	}
	feature := func(name, policy string) any {
		f := map[string]any{"name": name}
		if policy != "" {
			f["policy"] = policy
		}
		return f
	}
	conroe := func(features []any) map[string]any {
		cpu := map[string]any{"model": "Conroe"}
		if features != nil {
			cpu["features"] = features
		}
		return domainWith(map[string]any{"cpu": cpu})
	}
	withPod := func(c targetCase, selector map[string]any) targetCase {
		c["sourcePod"] = map[string]any{"spec": map[string]any{"nodeName": "node-1", "nodeSelector": selector}}
		return c
	}
	// Capacity: node-2 (4 CPUs, 8Gi) with the given pods, node-1 the source.
	capacity := func(vmiSpec map[string]any, pods ...any) targetCase {
		c := upstreamInput(nil, vmiSpec, nil, upstreamNode("node-1", labels()), upstreamNode("node-2", labels()))
		c["pods"] = pods
		return c
	}
	onNode2 := func(spec map[string]any) any {
		spec["nodeName"] = "node-2"
		return map[string]any{"metadata": map[string]any{"name": "p"}, "spec": spec}
	}
	requests := func(kv ...string) any { return map[string]any{"resources": map[string]any{"requests": labels(kv...)}} }
	sidecar := func(kv ...string) any {
		c := requests(kv...).(map[string]any)
		c["restartPolicy"] = "Always"
		return c
	}
	// The VMI's launcher pod as virt-controller renders it: the compute container requests the
	// VMI's 1 CPU and 2Gi plus KubeVirt's memory overhead (here 230Mi), the guest-console-log
	// sidecar 5m and 35M.
	launcher := func(c targetCase) targetCase {
		c["sourcePod"] = map[string]any{"spec": map[string]any{
			"nodeName":       "node-1",
			"containers":     []any{requests("cpu", "1", "memory", "2278Mi")},
			"initContainers": []any{sidecar("cpu", "5m", "memory", "35M")},
		}}
		return c
	}
	sixGi := onNode2(map[string]any{"containers": []any{requests("memory", "6Gi")}}) // leaves 2Gi
	return []upstreamTargetCase{
		{
			name: "a node without kubevirt.io/schedulable=true is not a candidate", class: classAgrees,
			upstream: `nodeselectorrenderer_test.go "the node requires the KubeVirt schedulable label" (NewNodeSelectorRenderer starts every launcher pod's nodeSelector with kubevirt.io/schedulable=true)`,
			in: upstreamInput(nil, nil, nil, upstreamNode("node-1", labels()), upstreamNode("node-2", labels()),
				unschedulableLabelled("node-3", ""), unschedulableLabelled("node-4", "yes")),
			candidates: []string{"node-2"},
		},
		{
			name: "a named node without kubevirt.io/schedulable conflicts", class: classAgrees,
			upstream:   `nodeselectorrenderer_test.go "the node requires the KubeVirt schedulable label"; migration.go createTargetPod keeps the rendered nodeSelector and adds the migration's`,
			in:         upstreamInput(map[string]any{"addedNodeSelectorTerm": namedTerm("node-3")}, nil, nil, upstreamNode("node-1", labels()), upstreamNode("node-2", labels()), unschedulableLabelled("node-3", "")),
			candidates: []string{}, reason: reference.TargetConflictsWithVMConstraints,
		},
		{
			name: "the VMI's nodeSelector overrides kubevirt.io/schedulable", class: classAgrees,
			upstream: `nodeselectorrenderer_test.go "user defined selectors are present" (NewNodeSelectorRenderer copies the VMI's nodeSelector over its own entries)`,
			in: upstreamInput(nil, map[string]any{"nodeSelector": labels("kubevirt.io/schedulable", "pinned")}, nil,
				upstreamNode("node-1", labels()), upstreamNode("node-2", labels()), unschedulableLabelled("node-3", "pinned")),
			candidates: []string{"node-3"},
		},
		{
			name: "a named CPU model needs nodes offering it", class: classAgrees,
			upstream:   `template_test.go "should add node selector for node discovery feature to template" (cpu-model.node.kubevirt.io/Conroe=true)`,
			in:         upstreamInput(nil, conroe(nil), nil, featureCluster...),
			candidates: []string{"node-2", "node-3", "node-4"},
		},
		{
			name: "required features are needed; disable, force and optional add nothing", class: classAgrees,
			upstream: `template_test.go "should add node selector for node discovery feature to template" (each CPUFeatureLabelsFromCPUFeatures label true); nodeselectorrenderer.go CPUFeatureLabelsFromCPUFeatures: policy "" or require only`,
			in: upstreamInput(nil, conroe([]any{feature("lahf_lm", "require"), feature("sse2", ""), feature("mmx", "disable"),
				feature("pcid", "force"), feature("vmx", "optional")}), nil, featureCluster...),
			candidates: []string{"node-3", "node-4"},
		},
		{
			name: "a forbidden feature excludes the nodes labelled with it", class: classAgrees,
			upstream:   `template.go setNodeAffinityForbiddenFeaturePolicy: a DoesNotExist requirement on cpu-feature.node.kubevirt.io/<feature> in every required term of the launcher pod (the fixture of template_test.go "should add node selector for node discovery feature to template" forbids ssse3)`,
			in:         upstreamInput(nil, conroe([]any{feature("lahf_lm", "require"), feature("ssse3", "forbid")}), nil, featureCluster...),
			candidates: []string{"node-3"},
		},
		{
			name: "host-passthrough with a required feature needs it", class: classAgrees,
			upstream: `template.go newNodeSelectorRenderer: WithModelAndFeatureLabels for any non-empty model; nodeselectorrenderer.go Render skips only the model label of host-model and host-passthrough`,
			in: upstreamInput(nil, domainWith(map[string]any{"cpu": map[string]any{"model": "host-passthrough", "features": []any{feature("sse2", "require")}}}), nil,
				featureCluster...),
			candidates: []string{"node-3", "node-4", "node-5"},
		},
		{
			name: "no CPU model with a required feature: read as host-model, the feature needed", class: classDiffers,
			upstream: `template.go newNodeSelectorRenderer: CPUModelLabelFromCPUModel fails without a model, so no feature label is added`,
			note:     "KubeVirt's VMI webhook defaults a missing model (to host-model unless the cluster names one) before the renderer sees the VMI; virt-rules reads an undefaulted VMI (eval's manifests) as host-model, so its required features are required as they would be once defaulted",
			in: upstreamInput(nil, map[string]any{"domain": map[string]any{"cpu": map[string]any{"features": []any{feature("avx512", "")}},
				"resources": map[string]any{"requests": map[string]any{"cpu": "1", "memory": "2Gi"}}}}, nil,
				upstreamNode("node-1", fakeSource),
				upstreamNode("node-2", labels("cpu-model-migration.node.kubevirt.io/fake", "true", "cpu-feature.node.kubevirt.io/fake", "true")),
				upstreamNode("node-3", labels("cpu-model-migration.node.kubevirt.io/fake", "true", "cpu-feature.node.kubevirt.io/fake", "true", "cpu-feature.node.kubevirt.io/avx512", "true"))),
			candidates: []string{"node-3"},
		},
		{
			name: "the VMI's architecture, in lower case, is required", class: classAgrees,
			upstream:   `nodeselectorrenderer_test.go "requires the renderer to have applied the architecture to the node selectors"; NewNodeSelectorRenderer lower-cases it into kubernetes.io/arch`,
			in:         upstreamInput(nil, map[string]any{"architecture": "ARM64"}, nil, archCluster...),
			candidates: []string{"node-3"},
		},
		{
			name: "no architecture: no kubernetes.io/arch requirement", class: classAgrees,
			upstream:   `nodeselectorrenderer_test.go "the node requires the KubeVirt schedulable label" (no architecture: the nodeSelector is kubevirt.io/schedulable only)`,
			in:         upstreamInput(nil, nil, nil, archCluster...),
			candidates: []string{"node-2", "node-3", "node-4"},
		},
		{
			name: "the VMI's nodeSelector overrides the architecture", class: classAgrees,
			upstream:   `nodeselectorrenderer.go NewNodeSelectorRenderer: the VMI's nodeSelector is copied over the architecture entry ("user defined selectors are present")`,
			in:         upstreamInput(nil, map[string]any{"architecture": "amd64", "nodeSelector": labels("kubernetes.io/arch", "arm64")}, nil, archCluster...),
			candidates: []string{"node-3"},
		},
		{
			name: "the source launcher pod's architecture is taken", class: classAgrees,
			upstream: `template.go RenderMigrationManifest renders the target pod from the VMI as the source pod was, so the source pod's kubernetes.io/arch is the target's`,
			in: withPod(upstreamInput(nil, nil, nil, archCluster...),
				labels("kubevirt.io/schedulable", "true", "kubernetes.io/arch", "amd64")),
			candidates: []string{"node-2"},
		},
		{
			name: "host-model avoids a node whose host-model CPU is obsolete", class: classAgrees,
			upstream: `template_test.go "should add affinity to pod of vmi host model" Entry "explicitly using host-model" (DoesNotExist on node-labeller.kubevirt.io/obsolete-host-model)`,
			in: upstreamInput(nil, hostModel, nil, upstreamNode("node-1", fakeSource),
				upstreamNode("node-2", labels("cpu-model-migration.node.kubevirt.io/fake", "true", "cpu-feature.node.kubevirt.io/fake", "true", "node-labeller.kubevirt.io/obsolete-host-model", "true")),
				upstreamNode("node-3", labels("cpu-model-migration.node.kubevirt.io/fake", "true", "cpu-feature.node.kubevirt.io/fake", "true"))),
			candidates: []string{"node-3"},
		},
		{
			name: "a named model ignores the obsolete host-model label", class: classAgrees,
			upstream:   `template_test.go "should not add empty affinity to pod" (model Conroe: no affinity at all)`,
			in:         upstreamInput(nil, conroe(nil), nil, upstreamNode("node-1", labels()), upstreamNode("node-2", labels("cpu-model.node.kubevirt.io/Conroe", "true", "node-labeller.kubevirt.io/obsolete-host-model", "true"))),
			candidates: []string{"node-2"},
		},
		{
			name: "the target pod requests the VMI's memory plus KubeVirt's overhead", class: classAgrees,
			upstream:   `template_test.go "should add 1G of memory overhead" (the compute container requests the VMI's memory plus GetMemoryOverhead); template.go RenderMigrationManifest renders the target pod with the same renderLaunchManifest and CalculateMemoryOverhead`,
			in:         launcher(capacity(nil, sixGi)),
			candidates: []string{}, reason: reference.TargetNoCapacity,
		},
		{
			name: "without the source launcher pod the overhead is not counted", class: classDiffers,
			upstream:   `template_test.go "should add 1G of memory overhead": the target pod needs 2Gi plus the overhead, which 2Gi free cannot hold`,
			note:       "KubeVirt's overhead depends on its configuration (hypervisor, architecture, network binding plugins, additionalGuestMemoryOverheadRatio) and is read from the source launcher pod; without that pod virt-rules counts the VMI's requests, so a node with room for the VMI but not its overhead is a candidate, and NoCapacity messages say the overhead is not counted. This is missing input, not a setting: no bundle data can supply it",
			in:         capacity(nil, sixGi),
			candidates: []string{"node-2"},
		},
		{
			name: "the launcher's guest-console-log sidecar adds to the target's request", class: classAgrees,
			upstream: `serialconsolelog.go generateSerialConsoleLogContainer (an init container with restartPolicy Always); component-helpers TestPodResourceRequests "restartable init container"`,
			// 5914Mi used leaves exactly the compute container's 2278Mi, not the sidecar's 35M more
			in:         launcher(capacity(nil, onNode2(map[string]any{"containers": []any{requests("memory", "5914Mi")}}))),
			candidates: []string{}, reason: reference.TargetNoCapacity,
		},
		{
			name: "another pod's init container larger than its containers counts", class: classAgrees,
			upstream:   `component-helpers TestPodResourceRequests "nil options, larger init container"`,
			in:         capacity(nil, onNode2(map[string]any{"containers": []any{requests("cpu", "1")}, "initContainers": []any{requests("cpu", "3500m")}})),
			candidates: []string{}, reason: reference.TargetNoCapacity,
		},
		{
			name: "another pod's containers larger than its init container count", class: classAgrees,
			upstream:   `component-helpers TestPodResourceRequests "nil options, larger containers"`,
			in:         capacity(nil, onNode2(map[string]any{"containers": []any{requests("cpu", "1"), requests("cpu", "2")}, "initContainers": []any{requests("cpu", "2")}})),
			candidates: []string{"node-2"},
		},
		{
			name: "another pod's overhead counts", class: classAgrees,
			upstream:   `component-helpers TestPodResourceRequests "pod overhead included"; noderesources fit.go computePodResourceRequest (PodRequests with overhead)`,
			in:         capacity(nil, onNode2(map[string]any{"containers": []any{requests("cpu", "3")}, "overhead": labels("cpu", "250m")})),
			candidates: []string{}, reason: reference.TargetNoCapacity,
		},
		{
			name: "an init container runs beside the sidecars started before it", class: classAgrees,
			upstream: `component-helpers TestPodResourceRequests "multiple restartable and regular init containers"`,
			// max(1 + 500m + 500m, 2 + 500m) = 2500m used: 1500m free for the VMI's 1
			in: capacity(nil, onNode2(map[string]any{
				"containers":     []any{requests("cpu", "1")},
				"initContainers": []any{sidecar("cpu", "500m"), requests("cpu", "2"), sidecar("cpu", "500m")},
			})),
			candidates: []string{"node-2"},
		},
		{
			name: "a pod-level request replaces its containers'", class: classAgrees,
			upstream:   `component-helpers TestPodLevelResourceRequests "both container-level and pod-level resources set with SkipPodLevelResources false" (PodLevelResources, beta and on by default since Kubernetes 1.34)`,
			in:         capacity(nil, onNode2(map[string]any{"containers": []any{requests("cpu", "1")}, "resources": map[string]any{"requests": labels("cpu", "3500m")}})),
			candidates: []string{}, reason: reference.TargetNoCapacity,
		},
		{
			name: "a resource requested at 0 is not checked", class: classAgrees,
			upstream:   `noderesources fit.go fitsRequest: a resource is compared only when the pod requests more than 0 of it`,
			in:         capacity(domainWith(map[string]any{"resources": map[string]any{"requests": labels("cpu", "0", "memory", "1Gi")}}), onNode2(map[string]any{"containers": []any{requests("cpu", "5")}})),
			candidates: []string{"node-2"},
		},
		{
			name: "host-model: only nodes that take the source node's model and features", class: classAgrees,
			upstream:   `migration_test.go "with CPU mode which is" Entry "host-model should be targeted only to nodes which support the model"`,
			in:         upstreamInput(nil, hostModel, nil, fake(fakeSource)...),
			candidates: []string{"node-2"},
		},
		{
			name: "not host-model: no host-model requirement", class: classAgrees,
			upstream:   `migration_test.go "with CPU mode which is" Entry "non-host-model should not be targeted to nodes which support the model"`,
			in:         upstreamInput(nil, nil, nil, fake(fakeSource)...),
			candidates: []string{"node-2", "node-3", "node-4"},
		},
		{
			name: "host-model on a node without host-model label: no target pod", class: classAgrees,
			upstream:   `migration.go prepareNodeSelectorForHostCpuModel: "unable to locate host cpu model", createTargetPod returns the error and creates no pod`,
			in:         upstreamInput(nil, hostModel, nil, fake(labels())...),
			candidates: []string{}, reason: reference.TargetConflictsWithVMConstraints,
		},
		{
			name: "host-model that migrated before: the source pod's CPU entries, not the node's", class: classAgrees,
			upstream: `migration.go prepareNodeSelectorForHostCpuModel: the source pod's cpu-feature and cpu-model-migration entries are copied, the node's labels read only without them`,
			in: withPod(upstreamInput(nil, hostModel, nil, fake(fakeSource)...),
				labels("kubevirt.io/schedulable", "true", "cpu-model-migration.node.kubevirt.io/first", "true", "cpu-feature.node.kubevirt.io/vmx", "true")),
			candidates: []string{"node-4"},
		},
		{
			name: "host-model with a source pod without CPU entries: the node's labels", class: classAgrees,
			upstream:   `migration.go prepareNodeSelectorForHostCpuModel: a VMI that never migrated`,
			in:         withPod(upstreamInput(nil, hostModel, nil, fake(fakeSource)...), labels("kubevirt.io/schedulable", "true")),
			candidates: []string{"node-2"},
		},
		{
			name: "no CPU model at all is taken as host-model", class: classDiffers,
			upstream:   `migration.go createTargetPod: host-model selectors only for spec.domain.cpu.model == host-model`,
			note:       "KubeVirt's VMI webhook defaults a missing model (to host-model unless the cluster names one), so a stored VMI always has one; virt-rules reads an undefaulted VMI (eval's manifests) as defaulted to host-model",
			in:         upstreamInput(nil, noModel, nil, fake(fakeSource)...),
			candidates: []string{"node-2"},
		},
		{
			name: "Intel source: Intel targets only", class: classAgrees,
			upstream:   `migration_test.go "should add CPU vendor label from source node" Entry "Intel vendor"`,
			in:         upstreamInput(nil, nil, nil, vendorCluster(intel, "true")...),
			candidates: []string{"node-2"},
		},
		{
			name: "AMD source: AMD targets only", class: classAgrees,
			upstream:   `migration_test.go "should add CPU vendor label from source node" Entry "AMD vendor"`,
			in:         upstreamInput(nil, nil, nil, vendorCluster(amd, "true")...),
			candidates: []string{"node-3"},
		},
		{
			name: "source without vendor label: no vendor requirement", class: classAgrees,
			upstream:   `migration_test.go "should add CPU vendor label from source node" Entry "no vendor label"`,
			in:         upstreamInput(nil, nil, nil, vendorCluster()...),
			candidates: []string{"node-2", "node-3", "node-4"},
		},
		{
			name: "named AMD node from an Intel source conflicts", class: classAgrees,
			upstream:   `migration_test.go "should add CPU vendor label from source node": the target pod's nodeSelector ANDs the vendor with the added selector`,
			in:         upstreamInput(map[string]any{"addedNodeSelectorTerm": namedTerm("node-3")}, nil, nil, vendorCluster(intel, "true")...),
			candidates: []string{}, reason: reference.TargetConflictsWithVMConstraints,
		},
		{
			name: "the VMI's nodeSelector names the vendor: the source's is not added", class: classAgrees,
			upstream:   `migration.go createTargetPod: the source node's vendor is added only when the pod's nodeSelector has none`,
			in:         upstreamInput(nil, map[string]any{"nodeSelector": labels(amd, "true")}, nil, vendorCluster(intel, "true")...),
			candidates: []string{"node-3"},
		},
		{
			name: "machine type from spec", class: classAgrees,
			upstream:   `template_test.go "should add node selector for machine type" Entry "when only spec machine type is provided"`,
			in:         upstreamInput(nil, domainWith(map[string]any{"machine": map[string]any{"type": "q35"}}), nil, machineCluster...),
			candidates: []string{"node-2"},
		},
		{
			name: "machine type from status before spec", class: classAgrees,
			upstream: `template_test.go "should add node selector for machine type" Entry "when both spec and status machine types are provided, status takes precedence"`,
			in: upstreamInput(nil, domainWith(map[string]any{"machine": map[string]any{"type": "q35"}}),
				map[string]any{"machine": map[string]any{"type": "pc-q35-rhel9.6.0"}}, machineCluster...),
			candidates: []string{"node-3"},
		},
		{
			name: "no node supports the machine type", class: classAgrees,
			upstream:   `template_test.go "should add node selector for machine type": the label is required, so no node without it takes the pod`,
			in:         upstreamInput(nil, domainWith(map[string]any{"machine": map[string]any{"type": "pc-i440fx-2.12"}}), nil, machineCluster...),
			candidates: []string{}, reason: reference.TargetConflictsWithVMConstraints,
		},
		{
			name: "several vendor labels on the source: the first in order", class: classDiffers,
			upstream: `migration.go getCPUVendorLabelKey: the first key of a map iteration (any one)`,
			note:     "virt-controller's pick among several vendor labels is random; virt-rules takes the first in order so that the answer is reproducible",
			in:       upstreamInput(nil, nil, nil, vendorCluster(intel, "true", amd, "true")...),
			// cpu-vendor.node.kubevirt.io/AMD sorts before .../Intel
			candidates: []string{"node-3"},
		},
		{
			name: "addedNodeSelector colliding with the VMI's nodeSelector is ANDed", class: classDiffers,
			upstream: `migration_test.go "should create target pod merging addedNodeSelector and preserving the labels in the existing NodeSelector and NodeAffinity"`,
			note:     "upstream overwrites the added entry with the VMI's value; design 001 ANDs the added constraint with the VM's, so a contradiction leaves no node",
			in: upstreamInput(map[string]any{"addedNodeSelector": map[string]any{"region": "west"}},
				map[string]any{"nodeSelector": labels("region", "east")}, nil,
				upstreamNode("node-1", labels("region", "east")), upstreamNode("node-2", labels("region", "east")), upstreamNode("node-3", labels("region", "west"))),
			candidates: []string{}, reason: reference.TargetConflictsWithVMConstraints,
		},
	}
}

func TestMigrationTargetAgainstUpstream(t *testing.T) {
	eng, err := engine.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := &targetHarness{eng: eng}
	counts := map[string]int{}
	for _, c := range upstreamTargetCases() {
		t.Run(c.name, func(t *testing.T) {
			counts[c.class]++
			d, err := h.engineDecision(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := targetText(d.CandidateNodes, targetReason(d), nil), targetText(c.candidates, c.reason, nil); got != want {
				t.Errorf("[%s] engine: %s, want %s (%s)\nmessage: %s", c.class, got, want, c.upstream, targetMessage(d))
			}
			_, ref, err := h.referenceDecision(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := targetText(ref.Candidates, ref.Reason, nil), targetText(c.candidates, c.reason, nil); got != want {
				t.Errorf("[%s] reference: %s, want %s (%s)", c.class, got, want, c.upstream)
			}
			if c.class == classDiffers && c.note == "" {
				t.Errorf("a case that differs by choice needs its note")
			}
		})
	}
	t.Logf("cases per class: %v", counts)
}

func namedTerm(name string) map[string]any {
	return map[string]any{"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{name}}}}
}

// SourceLauncherPod follows virt-controller's CurrentVMIPod: a pod the VMI controls, on its
// node, the most recently created.
func TestSourceLauncherPod(t *testing.T) {
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"namespace": "default", "name": "vmi", "uid": "u-1"},
		"status":   map[string]any{"nodeName": "node-1"},
	}}
	pod := func(name, node, created string, owner bool, label string) *unstructured.Unstructured {
		metadata := map[string]any{"namespace": "default", "name": name, "creationTimestamp": created}
		if owner {
			metadata["ownerReferences"] = []any{map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vmi", "uid": "u-1", "controller": true}}
		}
		if label != "" {
			metadata["labels"] = map[string]any{"kubevirt.io/created-by": label}
		}
		return &unstructured.Unstructured{Object: map[string]any{"metadata": metadata, "spec": map[string]any{"nodeName": node}}}
	}
	for _, c := range []struct {
		name string
		pods []*unstructured.Unstructured
		want string
	}{
		{"none", nil, ""},
		{"not the VMI's", []*unstructured.Unstructured{pod("other", "node-1", "2024-01-01T00:00:00Z", false, "u-2")}, ""},
		{"owned", []*unstructured.Unstructured{pod("a", "node-1", "2024-01-01T00:00:00Z", true, "")}, "a"},
		{"labelled", []*unstructured.Unstructured{pod("a", "node-1", "2024-01-01T00:00:00Z", false, "u-1")}, "a"},
		{"on another node (a target pod)", []*unstructured.Unstructured{pod("a", "node-2", "2024-01-01T00:00:00Z", true, "")}, ""},
		{"newest", []*unstructured.Unstructured{
			pod("new", "node-1", "2024-02-01T00:00:00Z", true, ""), pod("old", "node-1", "2024-01-01T00:00:00Z", true, ""),
		}, "new"},
	} {
		got := ""
		if p := engine.SourceLauncherPod(vmi, c.pods); p != nil {
			got = p.GetName()
		}
		if got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
