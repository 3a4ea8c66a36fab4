package cli_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

type placementOutput struct {
	MigrationTargets []struct {
		Migration          string          `json:"migration"`
		CandidateNodes     []string        `json:"candidateNodes"`
		TargetNodeAffinity json.RawMessage `json:"targetNodeAffinity"`
		Error              *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"error"`
	} `json:"migrationTargets"`
	NodeMigratability []struct {
		Node  string `json:"node"`
		Level int    `json:"level"`
	} `json:"nodeMigratability"`
	SchedulingAffinity []struct {
		VMI          string          `json:"vmi"`
		NodeAffinity json.RawMessage `json:"nodeAffinity"`
	} `json:"schedulingAffinity"`
}

func evalPlacement(dir string) placementOutput {
	GinkgoHelper()
	r := run("", "eval", dir)
	Expect(r.exitCode).To(Equal(0), r.stderr)
	var out placementOutput
	Expect(json.Unmarshal([]byte(r.stdout), &out)).To(Succeed())
	return out
}

var _ = Describe("eval of placement decisions", func() {
	It("decides one migration per outcome of design 001", func() {
		out := evalPlacement("examples/migration-target")
		got := map[string]string{}
		for _, m := range out.MigrationTargets {
			if m.Error != nil {
				Expect(m.CandidateNodes).To(BeEmpty(), m.Migration)
				Expect(m.Error.Message).To(HavePrefix("migration "+m.Migration+": "), m.Migration)
				got[m.Migration] = m.Error.Reason
			} else {
				Expect(m.CandidateNodes).To(Equal([]string{"node-2"}), m.Migration)
				got[m.Migration] = "node-2"
			}
		}
		Expect(got).To(Equal(map[string]string{
			"prod/to-node-2":         "node-2",
			"prod/to-missing-node":   "NodeNotFound",
			"prod/to-current-node":   "AlreadyOnNode",
			"prod/to-silver-node":    "ConflictsWithVMConstraints",
			"prod/to-full-node":      "NoCapacity",
			"prod/to-nvme":           "NoMatchingNode",
			"prod/invalid-term":      "InvalidTerm",
			"prod/upstream-selector": "node-2",
			"prod/by-annotation":     "node-2",
			"prod/anywhere":          "node-2",
			"prod/design-field":      "node-2",
		}))
	})

	It("ANDs the added term into every ORed required term of the VMI", func() {
		out := evalPlacement("examples/migration-target")
		for _, m := range out.MigrationTargets {
			if m.Migration != "prod/to-node-2" {
				continue
			}
			name := `{"key": "metadata.name", "operator": "In", "values": ["node-2"]}`
			Expect(m.TargetNodeAffinity).To(MatchJSON(`{
				"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
					{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}], "matchFields": [` + name + `]},
					{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}], "matchFields": [` + name + `]}
				]},
				"preferredDuringSchedulingIgnoredDuringExecution": [
					{"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
				]
			}`))
		}
	})

	It("computes design 002's migratability levels", func() {
		levels := map[string]int{}
		for _, n := range evalPlacement("examples/migratability").NodeMigratability {
			levels[n.Node] = n.Level
		}
		Expect(levels).To(Equal(map[string]int{
			"skylake-1": 100, "skylake-2": 100,
			"cascadelake-1": 50, "cascadelake-2": 50,
			"icelake-1": 0,
		}))
	})

	It("shapes only a host-model VMI's first scheduling", func() {
		got := map[string]json.RawMessage{}
		for _, s := range evalPlacement("examples/migratability").SchedulingAffinity {
			got[s.VMI] = s.NodeAffinity
		}
		Expect(got).To(HaveLen(3)) // running is already scheduled
		Expect(string(got["default/pinned"])).To(Equal("null"))
		level := func(n string) string {
			return `{"key": "kubevirt/host-model-migratability-level", "operator": "Gt", "values": ["` + n + `"]}`
		}
		Expect(got["default/new-web"]).To(MatchJSON(`{
			"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [` + level("49") + `]}]},
			"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchExpressions": [` + level("79") + `]}}]
		}`))
		Expect(got["default/new-db"]).To(MatchJSON(`{
			"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
				{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, ` + level("49") + `]},
				{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}, ` + level("49") + `]}
			]},
			"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchExpressions": [` + level("79") + `]}}]
		}`))
	})

	DescribeTable("rejects malformed placement input",
		func(manifest string, want string) {
			f := writeTemp("bad.yaml", manifest)
			r := run("", "eval", f)
			Expect(r.exitCode).To(Equal(1), r.stderr)
			Expect(r.stderr).To(ContainSubstring(want))
		},
		Entry("a migration without its VMI",
			"apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstanceMigration\nmetadata: {name: m, namespace: ns}\nspec: {vmiName: gone}\n",
			"bad.yaml:4: VirtualMachineInstanceMigration ns/m: spec.vmiName: VirtualMachineInstance ns/gone is not among the inputs, and the migration is not finished (phase none)"),
		Entry("an invalid migratability knob",
			"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kv, namespace: kubevirt}\nspec: {configuration: {migrations: {requireHostModelMigratabilityLevel: 150}}}\n---\n"+
				"apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: v, namespace: ns}\nspec: {domain: {devices: {}}}\n",
			"bad.yaml:4: KubeVirt kubevirt/kv: spec.configuration.migrations.requireHostModelMigratabilityLevel: "),
	)
})
