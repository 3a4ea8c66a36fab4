//go:build libvirt

package fidelity_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/cpumap"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// The CPU baseline (rego virtrules/node/baseline) judged by libvirt's own baseline
// (virConnectBaselineCPU) over host CPUs built from libvirt's CPU models, the nodes labelled by
// KubeVirt's own node labeller (kubevirt-oracle node-labels) from what libvirt says of each
// host, as virt-handler's node-labeller.sh has libvirt write it: its domain capabilities (the
// host model, and each CPU model usable or not) and its host CPU's features.

var host = clustersuite.Host

// baselineSets are the node sets judged: Intel generations with and without TSX, client and
// server parts, AMD EPYC generations, and vendors mixed.
var baselineSets = []struct {
	name  string
	hosts []clustersuite.CPUHost
}{
	{"Skylake client and server", []clustersuite.CPUHost{
		host("sky-client", "Intel", "Skylake-Client-IBRS"), host("sky-server", "Intel", "Skylake-Server-IBRS"),
	}},
	{"Skylake, Cascadelake, Icelake servers with TSX", []clustersuite.CPUHost{
		host("sky", "Intel", "Skylake-Server"), host("cascade", "Intel", "Cascadelake-Server"), host("ice", "Intel", "Icelake-Server"),
	}},
	{"Skylake, Cascadelake, Icelake servers without TSX", []clustersuite.CPUHost{
		host("sky", "Intel", "Skylake-Server-noTSX-IBRS"), host("cascade", "Intel", "Cascadelake-Server-noTSX"), host("ice", "Intel", "Icelake-Server-noTSX"),
	}},
	{"Cascadelake with TSX beside Icelake without", []clustersuite.CPUHost{
		host("cascade-1", "Intel", "Cascadelake-Server"), host("cascade-2", "Intel", "Cascadelake-Server"), host("ice", "Intel", "Icelake-Server-noTSX"),
	}},
	{"Icelake servers, one lacking a feature (microcode)", []clustersuite.CPUHost{
		host("ice-1", "Intel", "Icelake-Server"), host("ice-2", "Intel", "Icelake-Server", "-pku"), host("ice-3", "Intel", "Icelake-Server", "+arch-capabilities"),
	}},
	{"Skylake client with TSX and without", []clustersuite.CPUHost{
		host("tsx", "Intel", "Skylake-Client-IBRS"), host("notsx", "Intel", "Skylake-Client-noTSX-IBRS"),
	}},
	{"EPYC Rome and Milan", []clustersuite.CPUHost{
		host("rome", "AMD", "EPYC-Rome"), host("milan", "AMD", "EPYC-Milan"),
	}},
	{"EPYC Milan alone", []clustersuite.CPUHost{host("milan", "AMD", "EPYC-Milan")}},
	{"Intel and AMD", []clustersuite.CPUHost{host("ice", "Intel", "Icelake-Server"), host("rome", "AMD", "EPYC-Rome")}},
}

// labelledNodes are the Nodes of hosts, labelled by KubeVirt's node labeller from what libvirt
// says of each (clustersuite.LabellerLabels).
func labelledNodes(lib *cpumap.Libvirt, hosts []clustersuite.CPUHost) []*unstructured.Unstructured {
	GinkgoHelper()
	all := clustersuite.LabellerLabels(ctx, lib, oracle, filepath.Join(repoRoot, "test", "fidelity", "testdata", "kubevirt.yaml"), hosts)
	nodes := make([]*unstructured.Unstructured, len(hosts))
	for i, h := range hosts {
		labels := map[string]any{"kubernetes.io/hostname": h.Name, "kubevirt.io/schedulable": "true"}
		for k, v := range all[i] {
			labels[k] = v
		}
		nodes[i] = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": h.Name, "labels": labels},
		}}
	}
	return nodes
}

var _ = Describe("The CPU baseline, judged by libvirt's own baseline over nodes KubeVirt's node labeller labelled", Ordered, func() {
	var lib *cpumap.Libvirt

	BeforeAll(func() {
		var err error
		lib, err = cpumap.Open(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(lib.Close)
	})

	It("gives a guest CPU of exactly the features of libvirt's baseline for every node set", func() {
		eng, err := engine.New(ctx)
		Expect(err).NotTo(HaveOccurred())
		var judged []string
		for _, set := range baselineSets {
			nodes := labelledNodes(lib, set.hosts)
			view := eng.NewNodes()
			for _, n := range nodes {
				Expect(view.Upsert(n)).To(Succeed())
			}
			b, err := view.CPUBaseline(ctx, "")
			Expect(err).NotTo(HaveOccurred(), set.name)
			Expect(b.Groups).To(HaveLen(1), set.name)
			g := b.Groups[0]
			Expect(g.NotConsidered).To(BeEmpty(), set.name)
			Expect(g.Nodes).To(HaveLen(len(set.hosts)), set.name)

			hosts := make([]cpumap.CPU, len(set.hosts))
			vendors := map[string]bool{}
			for i, h := range set.hosts {
				hosts[i] = h.CPU
				vendors[h.CPU.Vendor] = true
			}
			theirs, theirFeatures, err := lib.Baseline(ctx, hosts)
			if len(vendors) > 1 {
				// What libvirt does with vendors mixed decides what agreement means.
				Expect(g.Model).To(BeNil(), set.name)
				Expect(g.Reason).To(Equal("VendorsDiffer"), set.name)
				judged = append(judged, fmt.Sprintf("%s: VendorsDiffer; libvirt: %s", set.name, libvirtAnswer(theirs, theirFeatures, err)))
				continue
			}
			Expect(err).NotTo(HaveOccurred(), set.name)
			Expect(g.Model).NotTo(BeNil(), "%s: %s %s", set.name, g.Reason, g.Message)
			mine := cpumap.CPU{Arch: "x86_64", Model: *g.Model, Vendor: *g.Vendor}
			for _, f := range g.Features {
				if f.Policy == "require" {
					mine.Require = append(mine.Require, f.Name)
				} else {
					mine.Disable = append(mine.Disable, f.Name)
				}
			}
			_, myFeatures, err := lib.Expand(ctx, mine)
			Expect(err).NotTo(HaveOccurred(), "%s: %+v", set.name, mine)
			Expect(myFeatures).To(Equal(theirFeatures), "%s: virt-rules' %+v against libvirt's %+v:\nonly virt-rules': %v\nonly libvirt's: %v",
				set.name, mine, theirs, minus(myFeatures, theirFeatures), minus(theirFeatures, myFeatures))
			Expect(g.GuestFeatures).To(Equal(theirFeatures), set.name)
			Expect(g.Share).To(Equal(100), set.name)
			judged = append(judged, fmt.Sprintf("%s: %s +%d -%d (libvirt: %s +%d -%d), %d features alike",
				set.name, *g.Model, len(mine.Require), len(mine.Disable), theirs.Model, len(theirs.Require), len(theirs.Disable), len(myFeatures)))
		}
		AddReportEntry("CPU baselines judged by libvirt", strings.Join(judged, "\n"))
	})

	It("names the kind of node that costs the baseline most, as libvirt's baseline without it", func() {
		eng, err := engine.New(ctx)
		Expect(err).NotTo(HaveOccurred())
		hosts := []clustersuite.CPUHost{
			host("ice-1", "Intel", "Icelake-Server-noTSX"), host("ice-2", "Intel", "Icelake-Server-noTSX"),
			host("cascade", "Intel", "Cascadelake-Server-noTSX"), host("sky", "Intel", "Skylake-Client-noTSX-IBRS"),
		}
		view := eng.NewNodes()
		for _, n := range labelledNodes(lib, hosts) {
			Expect(view.Upsert(n)).To(Succeed())
		}
		b, err := view.CPUBaseline(ctx, "")
		Expect(err).NotTo(HaveOccurred())
		g := b.Groups[0]
		Expect(g.Tradeoffs).NotTo(BeEmpty())
		t := g.Tradeoffs[0]
		Expect(t.Nodes).To(Equal([]string{"sky"}))
		var rest []cpumap.CPU
		for _, h := range hosts {
			if !slices.Contains(t.Nodes, h.Name) {
				rest = append(rest, h.CPU)
			}
		}
		_, restFeatures, err := lib.Baseline(ctx, rest)
		Expect(err).NotTo(HaveOccurred())
		Expect(t.GainedFeatures).To(Equal(minus(restFeatures, g.GuestFeatures)))
		AddReportEntry("CPU baseline tradeoff", fmt.Sprintf("%s for all; without %v (%s): %s, %d more features", *g.Model, t.Nodes, t.HostModel, *t.Model, len(t.GainedFeatures)))
	})
})

func libvirtAnswer(cpu cpumap.CPU, features []string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%s (vendor %q) with %d features", cpu.Model, cpu.Vendor, len(features))
}

// minus is what a has and b has not.
func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// exampleNodes are examples/cpu-baseline/nodes.yaml's: a cluster of three Intel server
// generations in two zones, one node cordoned and one KubeVirt's node labeller has not
// labelled (no virt-handler there). Their CPU labels are KubeVirt's node labeller's for such
// hosts; UPDATE_EXAMPLES=1 writes them.
var exampleNodes = []struct {
	host      clustersuite.CPUHost
	zone      string
	cordoned  bool
	labelless bool
}{
	{host: host("ice-1", "Intel", "Icelake-Server-noTSX"), zone: "zone-a"},
	{host: host("ice-2", "Intel", "Icelake-Server-noTSX"), zone: "zone-b"},
	{host: host("cascade-1", "Intel", "Cascadelake-Server-noTSX"), zone: "zone-a"},
	{host: host("cascade-2", "Intel", "Cascadelake-Server-noTSX"), zone: "zone-b"},
	{host: host("sky-1", "Intel", "Skylake-Server-noTSX-IBRS"), zone: "zone-b"},
	{host: host("ice-3", "Intel", "Icelake-Server-noTSX"), zone: "zone-a", cordoned: true},
	{host: host("infra-1", "Intel", "Icelake-Server-noTSX"), zone: "zone-a", labelless: true},
}

var _ = Describe("examples/cpu-baseline", func() {
	It("labels its nodes as KubeVirt's node labeller labels such hosts", func() {
		lib, err := cpumap.Open(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(lib.Close)
		hosts := make([]clustersuite.CPUHost, len(exampleNodes))
		for i, n := range exampleNodes {
			hosts[i] = n.host
		}
		labels := clustersuite.LabellerLabels(ctx, lib, oracle, filepath.Join(repoRoot, "test", "fidelity", "testdata", "kubevirt.yaml"), hosts)
		var b strings.Builder
		b.WriteString("# Nodes of three Intel server generations in two zones, as a cluster's `kubectl get nodes -o yaml`\n" +
			"# shows them (other labels and the status left out). The CPU labels are the ones KubeVirt v1.8.0's\n" +
			"# node labeller writes for such hosts, generated by test/fidelity (UPDATE_EXAMPLES=1) from what\n" +
			"# libvirt says of each host; ice-3 is cordoned, infra-1 runs no virt-handler (no CPU labels).\n" +
			"apiVersion: v1\nkind: List\nitems:\n")
		for i, n := range exampleNodes {
			l := map[string]string{"kubernetes.io/hostname": n.host.Name, "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": n.zone}
			if !n.labelless {
				l["kubevirt.io/schedulable"] = "true"
				for k, v := range labels[i] {
					l[k] = v
				}
			}
			fmt.Fprintf(&b, "- apiVersion: v1\n  kind: Node\n  metadata:\n    name: %s\n    labels:\n", n.host.Name)
			keys := slices.Sorted(maps.Keys(l))
			for _, k := range keys {
				fmt.Fprintf(&b, "      %s: %q\n", k, l[k])
			}
			if n.cordoned {
				b.WriteString("  spec:\n    unschedulable: true\n")
			}
		}
		path := filepath.Join(repoRoot, "examples", "cpu-baseline", "nodes.yaml")
		if os.Getenv("UPDATE_EXAMPLES") != "" {
			Expect(os.WriteFile(path, []byte(b.String()), 0o644)).To(Succeed())
		}
		got, err := os.ReadFile(path)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(got)).To(Equal(b.String()), "%s is not what KubeVirt's node labeller gives (UPDATE_EXAMPLES=1 rewrites it)", path)
	})
})
