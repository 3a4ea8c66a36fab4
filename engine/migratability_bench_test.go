package engine_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The node migratability benchmarks pair the engine's Nodes view (`rego`) with the plain Go
// grouped reference (`go`) on the same *unstructured.Unstructured nodes, conversion included
// on both sides:
//
//	full:   build the view from every node and compute all levels: NewNodes + Upsert each +
//	        Migratability, versus MigratabilityGroupedUnstructured.
//	add:    on a warm view, one node joins and all levels are recomputed: Upsert +
//	        Migratability, versus the incremental Go view (reference.MigratabilityView):
//	        UpsertUnstructured + Levels. The node leaves again untimed.
//	remove: likewise, one node leaves (Delete + Migratability, Delete + Levels) and comes
//	        back untimed.
//
// The targets (not asserted): full at 5,000 nodes within 200 ms, an add or remove within
// 10 ms.

var benchNodeCounts = []int{100, 1_000, 5_000}

// benchIncrementalNodes is the cluster size of the add and remove benchmarks.
const benchIncrementalNodes = 5_000

func BenchmarkNodeMigratability(b *testing.B) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range benchNodeCounts {
		b.Run("nodes="+strconv.Itoa(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(uint64(n), 3))
			nodes := benchNodes(r, "node", n)
			signatures := checkBenchNodes(b, eng, nodes)
			b.Run("full", func(b *testing.B) {
				b.Run("rego", func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						if _, err := freshView(b, eng, nodes).Migratability(ctx); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(signatures, "signatures")
				})
				b.Run("go", func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						reference.MigratabilityGroupedUnstructured(nodes)
					}
					b.ReportMetric(signatures, "signatures")
				})
			})
			if n != benchIncrementalNodes {
				return
			}
			extra := benchNodes(r, "extra", 64) // new nodes of the same generations
			view, goView := warmViews(ctx, b, eng, nodes)
			b.Run("add", func(b *testing.B) {
				b.Run("rego", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						node := extra[i%len(extra)]
						if err := view.Upsert(node); err != nil {
							b.Fatal(err)
						}
						if _, err := view.Migratability(ctx); err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						view.Delete(node.GetName())
						b.StartTimer()
					}
				})
				b.Run("go", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						node := extra[i%len(extra)]
						goView.UpsertUnstructured(node)
						goView.Levels()
						b.StopTimer()
						goView.Delete(node.GetName())
						b.StartTimer()
					}
				})
			})
			b.Run("remove", func(b *testing.B) {
				b.Run("rego", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						node := nodes[i%len(nodes)]
						view.Delete(node.GetName())
						if _, err := view.Migratability(ctx); err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						if err := view.Upsert(node); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
				})
				b.Run("go", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						node := nodes[i%len(nodes)]
						goView.Delete(node.GetName())
						goView.Levels()
						b.StopTimer()
						goView.UpsertUnstructured(node)
						b.StartTimer()
					}
				})
			})
		})
	}
}

// checkBenchNodes wants the engine and the grouped reference (and, for small clusters, the
// pairwise one) to agree on nodes, and returns the number of distinct signatures.
func checkBenchNodes(b *testing.B, eng *engine.Engine, nodes []*unstructured.Unstructured) float64 {
	b.Helper()
	view := eng.NewNodes()
	for _, node := range nodes {
		if err := view.Upsert(node); err != nil {
			b.Fatal(err)
		}
	}
	got, err := view.Migratability(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	ref := reference.NodesFromUnstructured(nodes)
	want := reference.MigratabilityGrouped(ref)
	if !maps.Equal(got, want) || !maps.Equal(want, reference.MigratabilityGroupedUnstructured(nodes)) {
		b.Fatal("engine and grouped references disagree; run TestNodeMigratabilityDifferential")
	}
	if len(nodes) <= 1_000 && !maps.Equal(want, reference.MigratabilityPairwise(ref)) {
		b.Fatal("grouped and pairwise references disagree; run the reference's tests")
	}
	if len(want) < len(nodes)*9/10 {
		b.Fatalf("only %d of %d nodes have a level", len(want), len(nodes))
	}
	signatures := map[string]bool{}
	for _, n := range ref {
		signatures[reference.SignatureOf(n).Key()] = true
	}
	return float64(len(signatures))
}

// warmViews are both sides' views of nodes with their levels computed once.
// freshView is a new view of eng holding nodes.
func freshView(b *testing.B, eng *engine.Engine, nodes []*unstructured.Unstructured) *engine.Nodes {
	b.Helper()
	view := eng.NewNodes()
	for _, node := range nodes {
		if err := view.Upsert(node); err != nil {
			b.Fatal(err)
		}
	}
	return view
}

func warmViews(ctx context.Context, b *testing.B, eng *engine.Engine, nodes []*unstructured.Unstructured) (*engine.Nodes, *reference.MigratabilityView) {
	b.Helper()
	view, goView := eng.NewNodes(), reference.NewMigratabilityView()
	for _, node := range nodes {
		if err := view.Upsert(node); err != nil {
			b.Fatal(err)
		}
		goView.Upsert(reference.NodeFromUnstructured(node))
	}
	if _, err := view.Migratability(ctx); err != nil {
		b.Fatal(err)
	}
	goView.Levels()
	return view, goView
}

// Benchmark clusters. -------------------------------------------------------------------------

// benchModels are CPU model names from old to new; generation k has benchHostModels[k] as
// host model and runs it and every older model.
var (
	benchModels = []string{
		"Penryn", "Nehalem", "Nehalem-IBRS", "Westmere", "Westmere-IBRS", "SandyBridge",
		"SandyBridge-IBRS", "IvyBridge", "IvyBridge-IBRS", "Haswell-noTSX", "Haswell-noTSX-IBRS",
		"Broadwell-noTSX", "Broadwell-noTSX-IBRS", "Skylake-Client-noTSX-IBRS",
		"Skylake-Server-noTSX-IBRS", "Cascadelake-Server-noTSX", "Icelake-Server-noTSX",
		"SapphireRapids", "GraniteRapids",
	}
	benchHostModels = []string{"Broadwell-noTSX-IBRS", "Skylake-Server-noTSX-IBRS", "Cascadelake-Server-noTSX", "Icelake-Server-noTSX", "SapphireRapids"}
	// benchVariantFeatures are features some nodes of a generation lack (microcode, BIOS).
	benchVariantFeatures = []string{"tsx-ctrl", "md-clear", "arch-capabilities"}
	benchHyperV          = []string{"base", "frequencies", "ipi", "reenlightenment", "reset", "runtime", "synic", "synic2", "synictimer", "time", "tlbflush", "vapic", "vpindex", "evmcs"}
)

// benchFeatures is generation k's feature names: 60 + 10k of a fixed list, the variant
// features included.
func benchFeatures(k int) []string {
	features := append([]string{}, benchVariantFeatures...)
	for i := range 57 + 10*k {
		features = append(features, fmt.Sprintf("feature-%03d", i))
	}
	return features
}

// benchNodes is a cluster of n nodes of five CPU generations, labelled as KubeVirt's node
// labeller labels them (about 150 to 200 labels each), with a kubelet-like status (no image
// list): a few cordoned or disabled nodes, about 50 distinct signatures.
func benchNodes(r *rand.Rand, prefix string, n int) []*unstructured.Unstructured {
	nodes := make([]*unstructured.Unstructured, n)
	for i := range nodes {
		k := r.IntN(len(benchHostModels))
		name := fmt.Sprintf("%s-%05d", prefix, i)
		labels := map[string]any{
			"beta.kubernetes.io/arch":                  "amd64",
			"beta.kubernetes.io/os":                    "linux",
			"kubernetes.io/arch":                       "amd64",
			"kubernetes.io/hostname":                   name,
			"kubernetes.io/os":                         "linux",
			"node-role.kubernetes.io/worker":           "",
			"topology.kubernetes.io/region":            "region-1",
			"topology.kubernetes.io/zone":              "zone-" + strconv.Itoa(r.IntN(3)),
			"cpu-vendor.node.kubevirt.io/Intel":        "true",
			"cpu-timer.node.kubevirt.io/tsc-frequency": strconv.Itoa(2_000_000_000 + 100_000_000*k),
			"cpu-timer.node.kubevirt.io/tsc-scalable":  "true",
			"kubevirt.io/ksm-enabled":                  "false",
			"kubevirt.io/schedulable":                  "true",
			"scheduling.node.kubevirt.io/tsc-frequency-" + strconv.Itoa(2_000_000_000+100_000_000*k): "true",
			reference.HostModelCPULabelPrefix + benchHostModels[k]:                                   "true",
		}
		for _, m := range benchModels[:slices.Index(benchModels, benchHostModels[k])+1] {
			labels[reference.CPUModelMigrationLabelPrefix+m] = "true"
			labels["cpu-model.node.kubevirt.io/"+m] = "true"
		}
		features := benchFeatures(k)
		lacks := r.IntN(2 * len(benchVariantFeatures)) // half the nodes lack a variant feature
		for j, f := range features {
			if j != lacks {
				labels[reference.CPUFeatureLabelPrefix+f] = "true"
			}
		}
		for _, f := range features[len(features)-12:] { // its newest features
			labels[reference.HostModelRequiredFeaturesPrefix+f] = "true"
		}
		for _, h := range benchHyperV {
			labels["hyperv.node.kubevirt.io/"+h] = "true"
		}
		spec := map[string]any{"podCIDR": fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)}
		switch x := r.IntN(100); {
		case x < 3:
			spec["unschedulable"] = true
		case x < 5:
			labels["kubevirt.io/schedulable"] = "false"
		}
		nodes[i] = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1",
			"kind":       "Node",
			"metadata": map[string]any{
				"name":              name,
				"uid":               fmt.Sprintf("00000000-0000-0000-0000-%012d", i),
				"resourceVersion":   strconv.Itoa(100_000 + i),
				"creationTimestamp": "2026-01-01T00:00:00Z",
				"labels":            labels,
				"annotations": map[string]any{
					"kubevirt.io/heartbeat":                                  "2026-01-01T00:00:00Z",
					"node.alpha.kubernetes.io/ttl":                           "0",
					"volumes.kubernetes.io/controller-managed-attach-detach": "true",
				},
			},
			"spec":   spec,
			"status": benchNodeStatus(name),
		}}
	}
	return nodes
}

func benchNodeStatus(name string) map[string]any {
	resources := map[string]any{
		"cpu": "64", "memory": "263855184Ki", "pods": "250", "ephemeral-storage": "467039008Ki",
		"hugepages-1Gi": "0", "hugepages-2Mi": "0", "devices.kubevirt.io/kvm": "1k",
		"devices.kubevirt.io/tun": "1k", "devices.kubevirt.io/vhost-net": "1k",
	}
	var conditions []any
	for _, c := range []string{"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"} {
		status := "False"
		if c == "Ready" {
			status = "True"
		}
		conditions = append(conditions, map[string]any{
			"type": c, "status": status, "reason": "Kubelet" + c,
			"lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
		})
	}
	return map[string]any{
		"capacity":    resources,
		"allocatable": maps.Clone(resources),
		"conditions":  conditions,
		"addresses": []any{
			map[string]any{"type": "InternalIP", "address": "192.168.0.1"},
			map[string]any{"type": "Hostname", "address": name},
		},
		"daemonEndpoints": map[string]any{"kubeletEndpoint": map[string]any{"Port": int64(10250)}},
		"nodeInfo": map[string]any{
			"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "cri-o://1.33.0",
			"kernelVersion": "5.14.0", "kubeProxyVersion": "", "kubeletVersion": "v1.33.0",
			"machineID": "m", "operatingSystem": "linux", "osImage": "Linux", "systemUUID": "u",
		},
	}
}
