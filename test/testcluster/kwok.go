package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KwokNodeAnnotation marks the nodes kwok acts as the kubelet of (value "fake").
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// kwokStageFiles are kwok's own stages, copied from its module by hack/kubevirt.sh into
// KubeVirtAssets/kwok-stages: nodes become Ready and renew their Lease, pods reach Running,
// complete and go when deleted.
var kwokStageFiles = []string{"node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml", "pod-complete.yaml", "pod-delete.yaml"}

// containerStatusImage is the line of kwok's pod-ready stage that reports a container's image.
var containerStatusImage = regexp.MustCompile(`(?m)^(\s*)- image: \{\{ \.image \| Quote \}\}$`)

// ImageDigest is the digest kwok reports for every container image. A real kubelet reports the
// image's digest, and virt-controller refuses to migrate a VMI with a containerDisk without one
// ("no reproducible image digest"), so pod-ready gets one change: it writes imageID.
const ImageDigest = "sha256:5d1ee6ea4c4fe7f8eb6fa2c4aeb02cd1b3ac0d9e48cbb5d4b8df6e2c2f7a0b61"

// kwokConfiguration is kwok's own configuration, the last document of the stream kwok reads
// with --config. Its one change from kwok's defaults is nodeLeaseParallelism 16 (default 4):
// at 5,000 nodes whose 10-minute Leases are renewed every 150 s kwok must write about 33
// Leases a second, and 4 workers against a busy API server managed under 7 (a make scale
// of 5,000 nodes and 20 pools saw 1,454 nodes NotReady in the pools stage, and
// kube-controller-manager re-reading and patching each; with 16, 8). A configuration read
// from a file gets none of kwok's defaults, so every option kwok checks is spelled out at its
// default value (without them kwok exits: "playStageParallelism must be greater than 0").
// The flags kwok is started with still take precedence.
const kwokConfiguration = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: false
  enableDebuggingHandlers: true
  enableContentionProfiling: false
  enableProfilingHandler: true
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 16
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
`

// kwokStages is kwok's stages and configuration as one YAML stream, pod-ready writing
// containers' imageID.
func kwokStages(assets string) ([]byte, error) {
	var docs []string
	for _, name := range kwokStageFiles {
		path := filepath.Join(assets, "kwok-stages", name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read kwok stage: %w", err)
		}
		doc := string(data)
		if name == "pod-ready.yaml" {
			if !containerStatusImage.MatchString(doc) {
				return nil, fmt.Errorf("kwok stage %s: no line %q to add imageID to", path, containerStatusImage)
			}
			doc = containerStatusImage.ReplaceAllString(doc,
				"$0\n$1  imageID: {{ printf \"%s@"+ImageDigest+"\" .image | Quote }}")
		}
		docs = append(docs, doc)
	}
	docs = append(docs, kwokConfiguration)
	return []byte(strings.Join(docs, "\n---\n")), nil
}

// CPU is what virt-handler's node labeller reports of a node's CPU.
type CPU struct {
	// Vendor, for cpu-vendor.node.kubevirt.io/<Vendor>.
	Vendor string
	// HostModel is libvirt's host-model CPU (host-model-cpu.node.kubevirt.io/<HostModel>).
	HostModel string
	// Models are the named CPU models the node runs (cpu-model.node.kubevirt.io/) and can take
	// host-model VMIs of (cpu-model-migration.node.kubevirt.io/); HostModel is always among them.
	Models []string
}

// Skylake is the CPU the nodes of the measured recipe carry.
var Skylake = CPU{Vendor: "Intel", HostModel: "Skylake-Client-IBRS", Models: []string{"Skylake-Client-IBRS", "Broadwell-noTSX-IBRS", "Haswell-noTSX-IBRS"}}

// MachineType is the machine type the virt-handler stand-in reports a VMI running with
// (status.machine.type), as a launcher built on CentOS Stream 9 does; every node supports it
// and its alias q35.
const MachineType = "pc-q35-rhel9.6.0"

// kubeletLabels are the labels a kubelet gives the node it registers: its hostname, OS and
// architecture, the last two also under their deprecated beta keys, which kubelets still set.
// A node without the beta ones gets them from kube-controller-manager's node lifecycle
// controller, one PATCH per node: at 5,000 nodes, writes still going on minutes into the
// next stage of make scale.
func kubeletLabels(name string) map[string]string {
	return map[string]string{
		corev1.LabelHostname:      name,
		corev1.LabelOSStable:      "linux",
		corev1.LabelArchStable:    "amd64",
		"beta.kubernetes.io/os":   "linux",
		"beta.kubernetes.io/arch": "amd64",
	}
}

// Node is a kwok node as a kubelet registers it and virt-handler then leaves it: labelled as
// a kubelet labels its node (kubeletLabels), schedulable, labelled with its CPU, the machine
// types it supports, and the KVM, TUN and vhost-net device-plugin resources; 32 CPUs and
// 256Gi. labels are added (or override).
func Node(name string, cpu CPU, labels map[string]string) *corev1.Node {
	l := kubeletLabels(name)
	l["kubevirt.io/schedulable"] = "true"
	l["machine-type.node.kubevirt.io/q35"] = "true"
	l["machine-type.node.kubevirt.io/"+MachineType] = "true"
	l["cpu-vendor.node.kubevirt.io/"+cpu.Vendor] = "true"
	l["host-model-cpu.node.kubevirt.io/"+cpu.HostModel] = "true"
	for _, m := range append([]string{cpu.HostModel}, cpu.Models...) {
		l["cpu-model.node.kubevirt.io/"+m] = "true"
		l["cpu-model-migration.node.kubevirt.io/"+m] = "true"
	}
	for k, v := range labels {
		l[k] = v
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("32"),
		corev1.ResourceMemory:           resource.MustParse("256Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
		"devices.kubevirt.io/kvm":       resource.MustParse("1k"),
		"devices.kubevirt.io/tun":       resource.MustParse("1k"),
		"devices.kubevirt.io/vhost-net": resource.MustParse("1k"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      l,
			Annotations: map[string]string{KwokNodeAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res.DeepCopy()},
	}
}

// CreateNodes creates nodes with their capacity and waits until each is Ready and rid of the
// not-ready taint kube-apiserver puts on a new node.
func (c *Cluster) CreateNodes(ctx context.Context, nodes ...*corev1.Node) error {
	for _, n := range nodes {
		status := n.Status
		n = n.DeepCopy()
		if err := c.Client.Create(ctx, n); err != nil {
			return fmt.Errorf("create node %s: %w", n.Name, err)
		}
		// kwok keeps the allocatable it finds; a merge patch needs no resourceVersion, so it
		// cannot conflict with kwok's first status write.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": status.Capacity, "allocatable": status.Allocatable}})
		if err != nil {
			return err
		}
		if err := c.Client.Status().Patch(ctx, n, client.RawPatch("application/merge-patch+json", patch)); err != nil {
			return fmt.Errorf("write capacity of node %s: %w", n.Name, err)
		}
	}
	for _, n := range nodes {
		name := n.Name
		err := c.waitFor(ctx, 2*time.Minute, "node "+name+" to be Ready and untainted", func(ctx context.Context) error {
			var got corev1.Node
			if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
				return err
			}
			for _, t := range got.Spec.Taints {
				if t.Key == corev1.TaintNodeNotReady {
					return fmt.Errorf("%w: tainted %v", errNotYet, t)
				}
			}
			if _, ok := got.Status.Allocatable["devices.kubevirt.io/kvm"]; !ok {
				return fmt.Errorf("%w: no devices.kubevirt.io/kvm", errNotYet)
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("%w: not Ready", errNotYet)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
