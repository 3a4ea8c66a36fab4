package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// golden is the expected `eval -o json` output kept beside each example. Set
// UPDATE_GOLDEN=1 to rewrite them from the current binary (then review the diff).
const golden = "eval.golden.out"

// seedRanking is design 000's order of precedence for its example VMI, by the example's
// policy names (examples/migration-policy/policies.yaml and README.md).
var seedRanking = []string{
	"tuned-bandwidth", "hpc-large", "gpu-small-priority", "a-small-hpc",
	"gpu-priority", "gpu-anywhere", "intel-gpu",
}

type evalOutput struct {
	MigrationPolicies []struct {
		VMI            string         `json:"vmi"`
		Policy         *string        `json:"policy"`
		MatchingLabels int            `json:"matchingLabels"`
		Configuration  map[string]any `json:"configuration"`
		Explanation    *struct {
			Precedence string `json:"precedence"`
			Candidates []struct {
				Policy  string `json:"policy"`
				Matched bool   `json:"matched"`
				Reason  string `json:"reason"`
			} `json:"candidates"`
		} `json:"explanation"`
	} `json:"migrationPolicies"`
}

func parseOutput(stdout string) evalOutput {
	GinkgoHelper()
	var out evalOutput
	Expect(json.Unmarshal([]byte(stdout), &out)).To(Succeed(), stdout)
	return out
}

func explanationOf(out evalOutput, vmi string) (order []string, matched []bool, precedence string) {
	GinkgoHelper()
	for _, d := range out.MigrationPolicies {
		if d.VMI == vmi {
			Expect(d.Explanation).NotTo(BeNil())
			for _, c := range d.Explanation.Candidates {
				order = append(order, c.Policy)
				matched = append(matched, c.Matched)
			}
			return order, matched, d.Explanation.Precedence
		}
	}
	Fail("no decision for " + vmi)
	return nil, nil, ""
}

var _ = Describe("eval", func() {
	// Every example directory with a golden file, which UPDATE_GOLDEN=1 rewrites. A new example
	// gets one by creating an empty eval.golden.out first (examples/deploy and
	// examples/custom-bundle are not eval inputs).
	examples, _ := filepath.Glob("../../examples/*/" + golden)

	It("has examples with expected output", func() {
		Expect(examples).NotTo(BeEmpty())
	})

	for _, g := range examples {
		dir := filepath.Dir(g)
		It("decides examples/"+filepath.Base(dir)+" as its "+golden+" says", func() {
			r := run("", "eval", "-o", "json", filepath.Join("examples", filepath.Base(dir)))
			// 1 exactly when some objects are in error (examples/cluster-dump), the report
			// complete all the same.
			var report struct {
				Errors []any `json:"errors"`
			}
			Expect(json.Unmarshal([]byte(r.stdout), &report)).To(Succeed(), r.stderr)
			if len(report.Errors) > 0 {
				Expect(r.exitCode).To(Equal(1), r.stderr)
			} else {
				Expect(r.exitCode).To(Equal(0), r.stderr)
			}
			if os.Getenv("UPDATE_GOLDEN") == "1" {
				Expect(os.WriteFile(g, []byte(r.stdout), 0o644)).To(Succeed())
			}
			want, err := os.ReadFile(g)
			Expect(err).NotTo(HaveOccurred())
			Expect(r.stdout).To(MatchJSON(want))
		})
	}

	It("ranks design 000's seven policies exactly as the design does", func() {
		r := run("", "eval", "--explain", "examples/migration-policy")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		order, matched, precedence := explanationOf(parseOutput(r.stdout), "hpc/fedora-gpu")
		Expect(precedence).To(Equal("default"))
		Expect(order).To(Equal(seedRanking))
		Expect(matched).To(Equal([]bool{true, true, true, true, true, true, false}))
	})

	It("switches to KubeVirt's precedence through bundle data alone", func() {
		bundle := bundleWithData("virtrules/migration/policy/data.json", `"default"`, `"kubevirt"`)

		r := run("", "eval", "--explain", "--bundle", bundle, "examples/migration-policy")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		order, _, precedence := explanationOf(parseOutput(r.stdout), "hpc/fedora-gpu")
		Expect(precedence).To(Equal("kubevirt"))
		// 4 labels each, 2 VMI labels each: the name decides.
		Expect(order[:2]).To(Equal([]string{"hpc-large", "tuned-bandwidth"}))
	})

	It("reads stdin, several documents and List kinds like files", func() {
		fromFiles := run("", "eval", "examples/migration-policy")
		var all []string
		for _, f := range []string{"namespaces.yaml", "kubevirt.yaml", "policies.yaml"} {
			b, err := os.ReadFile(filepath.Join(repoRoot, "examples/migration-policy", f))
			Expect(err).NotTo(HaveOccurred())
			all = append(all, string(b))
		}
		vmis, err := os.ReadFile(filepath.Join(repoRoot, "examples/migration-policy/vmis.yaml"))
		Expect(err).NotTo(HaveOccurred())
		list := vmiList(string(vmis))
		r := run(strings.Join(append(all, list), "\n---\n"), "eval", "-")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(MatchJSON(fromFiles.stdout))
	})

	It("ignores unknown kinds with one line each and warns of unknown namespaces", func() {
		deployment := writeTemp("deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: batch\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n")
		r := run("", "eval", "examples/migration-policy", deployment)
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stderr).To(ContainSubstring(deployment + ":1: ignoring apps/v1 Deployment batch/web"))
		Expect(r.stderr).To(ContainSubstring(deployment + ":7: ignoring v1 ConfigMap cm"))
		Expect(r.stderr).To(ContainSubstring("Namespace unlisted is not among the inputs"))
		Expect(strings.Count(r.stderr, "\n")).To(Equal(3), r.stderr)
	})

	It("warns of a pool field virt-rules' VirtualMachinePool does not have, which a cluster drops", func() {
		pools, err := os.ReadFile(filepath.Join(repoRoot, "examples", "pool", "pools.yaml"))
		Expect(err).NotTo(HaveOccurred())
		first := strings.SplitN(string(pools), "\n---", 2)[0]
		text := strings.Replace(first, "spec:\n  replicas: 100", "spec:\n  selector: \"a=b\"\n  replicas: 100", 1)
		pool := writeTemp("pool.yaml", text)
		r := run("", "eval", pool)
		Expect(r.exitCode).To(Equal(0), r.stderr)
		line := strings.Count(strings.SplitN(text, "selector: \"a=b\"", 2)[0], "\n") + 1
		Expect(line).To(BeNumerically(">", 1))
		Expect(r.stderr).To(ContainSubstring(fmt.Sprintf("%s:%d: VirtualMachinePool offline/my-vm-pool: spec.selector: pool.virt-rules.io/v1alpha1 has no such field", pool, line)))
	})

	It("prints a table for people and YAML for machines", func() {
		r := run("", "eval", "-o", "table", "examples/migration-policy")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		Expect(lines).To(HaveLen(5))
		Expect(strings.Fields(lines[0])[:4]).To(Equal([]string{"VMI", "MIGRATION", "POLICY", "SCORE"}))
		Expect(strings.Fields(lines[1])[:3]).To(Equal([]string{"batch/render", "gpu-anywhere", "1"}))
		Expect(strings.Fields(lines[2])[:3]).To(Equal([]string{"batch/web", "<none>", "0"}))
		Expect(strings.Fields(lines[3])[:3]).To(Equal([]string{"hpc/fedora-gpu", "tuned-bandwidth", "4"}))

		y := run("", "eval", "-o", "yaml", "examples/migration-policy")
		Expect(y.exitCode).To(Equal(0), y.stderr)
		j, err := yaml.YAMLToJSON([]byte(y.stdout))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(j)).To(MatchJSON(run("", "eval", "examples/migration-policy").stdout))
	})

	It("serves a bundle built by opa build and reports its revision", func() {
		tarball := filepath.Join(GinkgoT().TempDir(), "rules.tar.gz")
		runInRepo("go", "tool", "opa", "build", "--bundle", "rego", "--ignore", "*_test.rego",
			"--revision", "test-rev-1", "-o", tarball)

		r := run("", "version", "--bundle", tarball)
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring("bundle test-rev-1 (" + tarball + ")"))
		r = run("", "eval", "--bundle", tarball, "examples/migration-policy")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(MatchJSON(run("", "eval", "examples/migration-policy").stdout))
	})

	It("refuses a broken --bundle and names the file", func() {
		bundle := copyBundle(true)
		Expect(os.WriteFile(filepath.Join(bundle, "virtrules/migration/policy/oops.rego"),
			[]byte("package virtrules.migration.policy\n\noops := \n"), 0o644)).To(Succeed())
		r := run("", "eval", "--bundle", bundle, "examples/migration-policy")
		Expect(r.exitCode).NotTo(Equal(0))
		Expect(r.stderr).To(ContainSubstring("bundle refused"))
		Expect(r.stderr).To(MatchRegexp(`oops\.rego:\d+: rego_parse_error`))
	})

	DescribeTable("reports each malformed object as FILE:LINE: Kind namespace/name: field: what is wrong, and exits 1",
		func(manifest string, want ...string) {
			f := writeTemp("bad.yaml", manifest)
			r := run("", "eval", f)
			Expect(r.exitCode).To(Equal(1), r.stderr)
			var report struct {
				Errors []map[string]string `json:"errors"`
			}
			Expect(json.Unmarshal([]byte(r.stdout), &report)).To(Succeed(), r.stdout)
			Expect(report.Errors).NotTo(BeEmpty())
			Expect(r.stderr).To(ContainSubstring("error: " + strings.ReplaceAll(want[0], "FILE", f)))
			for _, w := range want[1:] {
				Expect(r.stderr).To(ContainSubstring(strings.ReplaceAll(w, "FILE", f)))
			}
			Expect(r.stderr).To(MatchRegexp(`\d+ objects? in error, \d+ errors?: every other object is decided\n$`))
		},
		Entry("YAML syntax", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a\n",
			"FILE:3: parse:", "yaml: line 3: did not find expected"),
		Entry("not an object", "---\napiVersion: v1\n---\n- a\n- b\n",
			"FILE:2: kind: want a non-empty string", "FILE:4: want a Kubernetes object (a mapping), got a list"),
		Entry("unquoted boolean label on a VMI", vmi("labels: {gpu: true}"),
			"FILE:6: VirtualMachineInstance ns/vm: metadata.labels.gpu: label values must be strings, got a boolean"),
		Entry("invalid label key", vmi("labels: {\"bad key\": x}"),
			"FILE:6: VirtualMachineInstance ns/vm: metadata.labels.bad key: invalid label key"),
		Entry("policy selector value not a string",
			policyDoc("p", "namespaceSelector: {matchLabels: {hpc-workloads: true}}"),
			"FILE:7: MigrationPolicy p: spec.selectors.namespaceSelector.matchLabels.hpc-workloads:"),
		Entry("negative bandwidth", policyDoc("p", "virtualMachineInstanceSelector: {a: b}", "bandwidthPerMigration: -1Mi"),
			"FILE:6: MigrationPolicy p: spec.bandwidthPerMigration: bandwidthPerMigration must not be negative"),
		Entry("same selectors twice",
			policyDoc("p", "virtualMachineInstanceSelector: {a: b}")+"---\n"+policyDoc("q", "virtualMachineInstanceSelector: {matchLabels: {a: b}}"),
			"FILE:6: MigrationPolicy p: spec.selectors: same selectors as MigrationPolicy \"q\"", "FILE:14: MigrationPolicy q: spec.selectors: same selectors as MigrationPolicy \"p\""),
		Entry("KubeVirt CR field of the wrong type",
			"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kv, namespace: kubevirt}\nspec: {configuration: {migrations: {allowPostCopy: \"yes\"}}}\n",
			"FILE:4: KubeVirt kubevirt/kv: spec.configuration.migrations.allowPostCopy: want bool, got a string", "FILE:1: KubeVirt kubevirt/kv: decided as if there were no KubeVirt CR"),
		Entry("a key given twice", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, name: b}\n",
			"FILE:3: parse:", `line 3: key "name" already set in map`),
		Entry("one VMI twice: without a namespace and in default",
			"apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: v1}\n---\napiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: v1, namespace: default}\n",
			"FILE:7: VirtualMachineInstance default/v1: metadata.name: also defined at FILE:1: this one is not decided"),
		Entry("KubeVirt CR configuration not an object",
			"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kv, namespace: kubevirt}\nspec: {configuration: hello}\n",
			"FILE:4: KubeVirt kubevirt/kv: spec.configuration: want v1.KubeVirtConfiguration, got a string"),
		Entry("node labels not a map", "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: [a]}\n",
			"FILE:3: Node n1: metadata.labels: want a map of label key to string value, got a list"),
		Entry("two KubeVirt CRs",
			"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: a, namespace: kubevirt}\n---\napiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: b, namespace: kubevirt}\n",
			"FILE:5: KubeVirt kubevirt/b: a second KubeVirt CR (the first is at FILE:1; a cluster has one): this one is not read"),
		Entry("bad item in a List",
			"apiVersion: v1\nkind: List\nitems:\n- "+strings.ReplaceAll(strings.TrimSpace(vmi("labels: {a: b}")), "\n", "\n  ")+"\n- apiVersion: kubevirt.io/v1\n  kind: VirtualMachineInstance\n  metadata: {namespace: x}\n",
			"FILE:12: VirtualMachineInstance x/<no name>: items[1].metadata.name: want a non-empty string"),
		Entry("every error, not only the first", vmi("labels: {a: 1}")+"---\n"+strings.Replace(vmi("labels: {b: [x]}"), "name: vm", "name: vm2", 1),
			"FILE:6: VirtualMachineInstance ns/vm: metadata.labels.a:", "FILE:13: VirtualMachineInstance ns/vm2: metadata.labels.b:"),
	)

	It("exits non-zero on a path that does not exist", func() {
		r := run("", "eval", "no/such/dir")
		Expect(r.exitCode).NotTo(Equal(0))
		Expect(r.stderr).To(ContainSubstring("no/such/dir"))
	})
})

func vmi(metadataLine string) string {
	return "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: vm\n  namespace: ns\n  " + metadataLine + "\n"
}

func policyDoc(name, selectors string, specLines ...string) string {
	spec := ""
	for _, l := range specLines {
		spec += "  " + l + "\n"
	}
	return "apiVersion: migrations.kubevirt.io/v1alpha1\nkind: MigrationPolicy\nmetadata:\n  name: " + name +
		"\nspec:\n" + spec + "  selectors:\n    " + selectors + "\n"
}

// copyBundle copies rego/ as an admin would start their own bundle; without its tests unless
// withTests (as `opa build --ignore '*_test.rego'` ships it).
func copyBundle(withTests bool) string {
	GinkgoHelper()
	bundle := filepath.Join(GinkgoT().TempDir(), "bundle")
	Expect(os.CopyFS(bundle, os.DirFS(filepath.Join(repoRoot, "rego")))).To(Succeed())
	if !withTests {
		clustersuite.RemoveRegoTests(bundle)
	}
	return bundle
}

// bundleWithData is copyBundle(false) with the first old in its data file (a path in the
// bundle) replaced by new: a change an admin makes through bundle data alone.
func bundleWithData(file, old, new string) string {
	GinkgoHelper()
	bundle := copyBundle(false)
	data := filepath.Join(bundle, file)
	b, err := os.ReadFile(data)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(data, []byte(strings.Replace(string(b), old, new, 1)), 0o644)).To(Succeed())
	return bundle
}

// vmiList wraps the VMI documents of a multi-document YAML file into one v1 List.
func vmiList(multiDoc string) string {
	var items []string
	for _, doc := range strings.Split(multiDoc, "\n---\n") {
		j, err := yaml.YAMLToJSON([]byte(doc))
		Expect(err).NotTo(HaveOccurred())
		items = append(items, string(j))
	}
	return `{"apiVersion": "v1", "kind": "List", "items": [` + strings.Join(items, ",") + `]}`
}

var _ = Describe("eval on the designs' fields KubeVirt's schema lacks", func() {
	It("reads them, and warns that a cluster drops or refuses them", func() {
		dir := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(dir, "objects.yaml"), []byte(`apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: design-shape}
spec:
  selectors:
    virtualMachineInstanceSelector:
      matchLabels: {size: small}
---
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    migrations:
      requireHostModelMigratabilityLevel: 50
      preferedHostModelMigratabilityLevel: {level: 80}
`), 0o644)).To(Succeed())
		r := run("", "eval", "-o", "json", dir)
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(strings.Split(strings.TrimSpace(r.stderr), "\n")).To(ConsistOf(
			ContainSubstring("MigrationPolicy design-shape: spec.selectors.virtualMachineInstanceSelector.matchLabels: KubeVirt's MigrationPolicy schema refuses"),
			ContainSubstring("spec.configuration.migrations.requireHostModelMigratabilityLevel: KubeVirt's KubeVirt CR has no such field: a cluster drops it; use the annotation migrations.virt-rules.io/require-host-model-migratability-level"),
			ContainSubstring("spec.configuration.migrations.preferedHostModelMigratabilityLevel: KubeVirt's KubeVirt CR has no such field"),
		))

		r = run("", "eval", "-o", "json", "examples/migration-target")
		Expect(r.stderr).To(ContainSubstring("VirtualMachineInstanceMigration prod/design-field: spec.addedNodeSelectorTerm: KubeVirt's VirtualMachineInstanceMigration has no such field: a cluster drops it and the migration runs unconstrained"))
		Expect(strings.Count(r.stderr, "addedNodeSelectorTerm")).To(Equal(1), "only design-field uses the design's field")
	})
})

var _ = Describe("eval --drain", func() {
	const drainGolden = "examples/drain/drain.golden.out"

	It("previews draining examples/drain's node-a as drain.golden.out says, and exits 1: VMIs are stuck", func() {
		r := run("", "eval", "-o", "json", "--drain", "node-a", "examples/drain")
		Expect(r.exitCode).To(Equal(1), r.stderr)
		Expect(r.stderr).To(ContainSubstring("drain: 2 VMIs stuck: draining node-a cannot finish"))
		if os.Getenv("UPDATE_GOLDEN") == "1" {
			Expect(os.WriteFile(filepath.Join(repoRoot, drainGolden), []byte(r.stdout), 0o644)).To(Succeed())
		}
		want, err := os.ReadFile(filepath.Join(repoRoot, drainGolden))
		Expect(err).NotTo(HaveOccurred())
		Expect(r.stdout).To(MatchJSON(want))

		table := run("", "eval", "-o", "table", "--drain-selector", "kubernetes.io/hostname=node-a", "examples/drain")
		Expect(table.exitCode).To(Equal(1), table.stderr)
		Expect(table.stdout).To(ContainSubstring("DRAIN node-a: 8 VMIs, 2 stuck"))
		Expect(table.stdout).To(MatchRegexp(`shop/web-3\s+node-a\s+LiveMigrate\s+stuck\s+-\s+0\s+NoCapacity`))
	})

	It("exits 0 when every VMI can go, and names what it cannot drain", func() {
		// node-b holds no VMI: nothing is stuck.
		r := run("", "eval", "-o", "json", "--drain", "node-b", "examples/drain")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring(`"stuck": 0`))

		missing := run("", "eval", "--drain", "node-a,node-x", "examples/drain")
		Expect(missing.exitCode).To(Equal(2))
		Expect(missing.stderr).To(ContainSubstring("drain: node node-x: not among the nodes read (4)"))
		Expect(missing.stdout).To(BeEmpty())

		none := run("", "eval", "--drain-selector", "zone=mars", "examples/drain")
		Expect(none.exitCode).To(Equal(2))
		Expect(none.stderr).To(ContainSubstring(`drain: selector "zone=mars" matches none of the 4 nodes read`))

		bad := run("", "eval", "--drain-selector", "zone in (", "examples/drain")
		Expect(bad.exitCode).To(Equal(2))
		Expect(bad.stderr).To(ContainSubstring(`drain: selector "zone in ("`))
	})
})

var _ = Describe("eval --cpu-baseline", func() {
	const baselineGolden = "examples/cpu-baseline/cpu-baseline.golden.out"

	It("gives examples/cpu-baseline's nodes the CPU baseline.golden.out says, per zone, nodes left out named", func() {
		r := run("", "eval", "-o", "json", "--cpu-baseline-group-by", "topology.kubernetes.io/zone", "examples/cpu-baseline")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stderr).To(ContainSubstring("cpuBaseline topology.kubernetes.io/zone=zone-a: 1 node(s) not considered (NoCPULabels): infra-1"))
		Expect(r.stderr).To(ContainSubstring("cpuBaseline topology.kubernetes.io/zone=zone-a: 1 node(s) not considered (Unschedulable): ice-3"))
		if os.Getenv("UPDATE_GOLDEN") == "1" {
			Expect(os.WriteFile(filepath.Join(repoRoot, baselineGolden), []byte(r.stdout), 0o644)).To(Succeed())
		}
		want, err := os.ReadFile(filepath.Join(repoRoot, baselineGolden))
		Expect(err).NotTo(HaveOccurred())
		Expect(r.stdout).To(MatchJSON(want))

		table := run("", "eval", "-o", "table", "--cpu-baseline", "examples/cpu-baseline")
		Expect(table.exitCode).To(Equal(0), table.stderr)
		Expect(table.stdout).To(MatchRegexp(`\(all nodes\)\s+5\s+Intel\s+Skylake-Server-noTSX-IBRS\s+0\s+100%`))
		Expect(table.stdout).To(ContainSubstring("without sky-1 (Skylake-Server-noTSX-IBRS): Cascadelake-Server-noTSX, 3 more features"))
		Expect(table.stdout).To(ContainSubstring("cpuModel: Skylake-Server-noTSX-IBRS"))
	})

	It("leaves cpuBaseline out unless asked", func() {
		r := run("", "eval", "-o", "json", "examples/cpu-baseline")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).NotTo(ContainSubstring("cpuBaseline"))
	})
})
