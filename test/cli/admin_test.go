package cli_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// diffOutput is `diff -o json`.
type diffOutput struct {
	BaseRevision string `json:"baseRevision"`
	NewRevision  string `json:"newRevision"`
	Changes      []struct {
		Decision string         `json:"decision"`
		Object   string         `json:"object"`
		Fields   []string       `json:"fields"`
		Base     map[string]any `json:"base"`
		New      map[string]any `json:"new"`
	} `json:"changes"`
}

var _ = Describe("diff", func() {
	var tarball string
	BeforeEach(func() {
		tarball = filepath.Join(GinkgoT().TempDir(), "custom.tar.gz")
		makeTarget("custom-bundle", "CUSTOM_BUNDLE="+tarball)
	})

	// examples/custom-bundle/README.md: hpc/fedora-gpu obeys hpc-large instead of
	// tuned-bandwidth, and design 003's naming pool scales in my-vm-1 instead of my-vm-2;
	// nothing else in examples/ changes.
	It("lists exactly the changes examples/custom-bundle/README.md describes, on every example", func() {
		type change struct{ decision, object string }
		var got []change
		for _, dir := range []string{"migration-policy", "migration-target", "migratability", "pool"} {
			r := run("", "diff", "--bundle", tarball, "-o", "json", "--now", "2026-01-01T00:00:00Z", filepath.Join("examples", dir))
			Expect(r.exitCode).To(BeElementOf(0, 1), "examples/%s: %s", dir, r.stderr)
			var out diffOutput
			Expect(json.Unmarshal([]byte(r.stdout), &out)).To(Succeed(), r.stdout)
			Expect(r.exitCode == 1).To(Equal(len(out.Changes) > 0), "exit status 1 exactly when something changes")
			Expect(out.NewRevision).To(HavePrefix("custom-"))
			for _, c := range out.Changes {
				got = append(got, change{c.Decision, c.Object})
				switch c.Object {
				case "hpc/fedora-gpu":
					Expect(c.Fields).To(ContainElements("policy", "configuration"))
					Expect(c.Base["policy"]).To(Equal("tuned-bandwidth"))
					Expect(c.New["policy"]).To(Equal("hpc-large"))
					Expect(c.Base["explanation"]).NotTo(BeNil(), "both sides carry their explanation")
					Expect(c.New["explanation"]).NotTo(BeNil())
				case "naming/my-vm":
					Expect(c.Fields).To(Equal([]string{"delete"}))
					Expect(c.Base["delete"]).To(Equal([]any{"my-vm-2"}))
					Expect(c.New["delete"]).To(Equal([]any{"my-vm-1"}))
				}
			}
		}
		Expect(got).To(ConsistOf(change{"migrationPolicies", "hpc/fedora-gpu"}, change{"pools", "naming/my-vm"}))
	})

	It("explains both sides in the table and exits 0 when nothing changes, 1 with objects in error, 2 when it cannot run", func() {
		r := run("", "diff", "--bundle", tarball, "-o", "table", "examples/migration-policy")
		Expect(r.exitCode).To(Equal(1), r.stderr)
		Expect(r.stdout).To(ContainSubstring("hpc/fedora-gpu"))
		Expect(r.stdout).To(ContainSubstring("base: hpc-large: lost to tuned-bandwidth"))
		Expect(r.stdout).To(ContainSubstring("new: tuned-bandwidth: lost to hpc-large"))

		same := run("", "diff", "--bundle", tarball, "--base", tarball, "examples/migration-policy")
		Expect(same.exitCode).To(Equal(0), same.stderr)
		Expect(same.stdout).To(ContainSubstring("no decision changes"))

		for _, args := range [][]string{
			{"diff", "--bundle", "does-not-exist.tar.gz", "examples/migration-policy"},
			{"diff", "examples/migration-policy"},
			{"diff", "--bundle", tarball},
			{"diff", "--bundle", tarball, "--no-such-flag", "examples/migration-policy"},
			{"diff", "--bundle", tarball, writeTemp("empty.yaml", "# nothing yet\n")},
		} {
			bad := run("", args...)
			Expect(bad.exitCode).To(Equal(2), "%v: %s", args, bad.stderr)
			Expect(bad.stderr).To(ContainSubstring("error: "), "%v", args)
		}

		// An object in error under both bundles is no change, but it is in error: listed, and 1.
		bad := writeTemp("bad.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {a: 1}}\n")
		inError := run("", "diff", "--bundle", tarball, "--base", tarball, bad)
		Expect(inError.exitCode).To(Equal(1), inError.stderr)
		Expect(inError.stdout).To(ContainSubstring("no decision changes"))
		Expect(inError.stdout).To(MatchRegexp(bad + `:3\s+Namespace x\s+metadata.labels.a\s+label values must be strings`))
		Expect(inError.stderr).To(ContainSubstring("error: " + bad + ":3: Namespace x: metadata.labels.a: label values must be strings"))
	})
})

var _ = Describe("bench", func() {
	It("times every object but those in error, lists those once, and exits 1", func() {
		r := run("", "bench", "--rounds", "1", "examples/cluster-dump")
		Expect(r.exitCode).To(Equal(1), r.stderr)
		Expect(r.stdout).To(ContainSubstring("migrationPolicies"))
		Expect(strings.Count(r.stderr, "error: ")).To(Equal(2), r.stderr)
		Expect(r.stderr).To(ContainSubstring("examples/cluster-dump/dump.yaml:100: VirtualMachineInstanceMigration prod/lost: items[10].spec.vmiName:"))
		Expect(r.stderr).To(HaveSuffix("2 objects in error, 2 errors: every other object is decided\n"))
	})

	It("times each decision on the manifests and compares with a saved baseline", func() {
		r := run("", "bench", "--rounds", "3", "-o", "json", "examples/migration-policy", "examples/pool/namespaces.yaml", "examples/pool/naming.yaml")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		var baseline struct {
			Revision  string `json:"revision"`
			Rounds    int    `json:"rounds"`
			Decisions map[string]struct {
				Samples    int     `json:"samples"`
				P50Seconds float64 `json:"p50Seconds"`
				P99Seconds float64 `json:"p99Seconds"`
			} `json:"decisions"`
		}
		Expect(json.Unmarshal([]byte(r.stdout), &baseline)).To(Succeed(), r.stdout)
		Expect(baseline.Rounds).To(Equal(3))
		// Each VMI (eval's migrationPolicies), each of examples/migration-policy's 7 policies
		// and naming.yaml's one pool is decided once a round.
		evalRun := run("", "eval", "examples/migration-policy", "examples/pool/namespaces.yaml", "examples/pool/naming.yaml")
		Expect(evalRun.exitCode).To(Equal(0), evalRun.stderr)
		vmis := len(parseOutput(evalRun.stdout).MigrationPolicies)
		Expect(vmis).To(BeNumerically(">", 4))
		Expect(baseline.Decisions["migrationPolicies"].Samples).To(Equal(3 * vmis))
		Expect(baseline.Decisions["migrationPolicyValidation"].Samples).To(Equal(3 * 7))
		Expect(baseline.Decisions["pools"].Samples).To(Equal(3))
		for name, d := range baseline.Decisions {
			Expect(d.P50Seconds).To(BeNumerically(">", 0), name)
			Expect(d.P99Seconds).To(BeNumerically(">=", d.P50Seconds), name)
		}
		saved := writeTemp("baseline.json", r.stdout)

		cmp := run("", "bench", "--rounds", "3", "--compare", saved, "examples/migration-policy")
		Expect(cmp.exitCode).To(Equal(0), cmp.stderr)
		Expect(cmp.stdout).To(ContainSubstring("P50 RATIO"))
		Expect(cmp.stdout).To(MatchRegexp(`migrationPolicies\s+12\s`))

		// A ratio no run can meet fails the gate.
		gate := run("", "bench", "--rounds", "1", "--compare", saved, "--max-ratio", "0.000001", "examples/migration-policy")
		Expect(gate.exitCode).To(Equal(1), gate.stdout+gate.stderr)
		Expect(gate.stderr).To(ContainSubstring("over --max-ratio"))

		bad := run("", "bench", "--compare", writeTemp("not.json", "nope"), "examples/migration-policy")
		Expect(bad.exitCode).NotTo(Equal(0))
		Expect(bad.stderr).To(ContainSubstring("not a bench -o json baseline"))
	})
})

var _ = Describe("eval --candidates", func() {
	It("lists, for a VMI not migrating, where it could go now and each other node's first reason", func() {
		r := run("", "eval", "--candidates", "examples/migration-target/nodes.yaml", "examples/migration-target/vmi.yaml")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		var out struct {
			MigrationPolicies   []any `json:"migrationPolicies"`
			MigrationCandidates []struct {
				VMI            string   `json:"vmi"`
				Node           string   `json:"node"`
				CandidateNodes []string `json:"candidateNodes"`
				Nodes          []struct {
					Node      string `json:"node"`
					Candidate bool   `json:"candidate"`
					Reason    string `json:"reason"`
				} `json:"nodes"`
			} `json:"migrationCandidates"`
		}
		Expect(json.Unmarshal([]byte(r.stdout), &out)).To(Succeed(), r.stdout)
		Expect(out.MigrationPolicies).To(HaveLen(1), "the existing keys are still there")
		Expect(out.MigrationCandidates).To(HaveLen(1))
		c := out.MigrationCandidates[0]
		Expect(c.VMI).To(Equal("prod/db"))
		Expect(c.Node).To(Equal("node-1"))
		// examples/migration-target/README.md: node-2 is the one node db may go to without an
		// added term; every other node fails one of its own constraints.
		Expect(c.CandidateNodes).To(Equal([]string{"node-2"}))
		reasons := map[string]string{}
		for _, n := range c.Nodes {
			reasons[n.Node] = n.Reason
			Expect(n.Candidate).To(Equal(n.Node == "node-2"), n.Node)
		}
		Expect(reasons).To(HaveLen(6))
		Expect(reasons["node-1"]).To(ContainSubstring("already runs on this node"))
		Expect(reasons["node-3"]).To(ContainSubstring("tier=gold"))
		Expect(reasons["node-4"]).To(ContainSubstring("insufficient cpu"))
		Expect(reasons["node-5"]).To(ContainSubstring("cordoned"))
		Expect(reasons["node-6"]).To(ContainSubstring("taint"))

		// With the example's migrations the VMI is migrating: no candidates are listed for it,
		// and without --candidates the key is absent.
		migrating := run("", "eval", "--candidates", "examples/migration-target")
		Expect(migrating.exitCode).To(Equal(0), migrating.stderr)
		Expect(migrating.stdout).NotTo(ContainSubstring(`"migrationCandidates"`))
		plain := run("", "eval", "examples/migration-target/nodes.yaml", "examples/migration-target/vmi.yaml")
		Expect(plain.stdout).NotTo(ContainSubstring(`"migrationCandidates"`))

		table := run("", "eval", "-o", "table", "--candidates", "examples/migration-target/nodes.yaml", "examples/migration-target/vmi.yaml")
		Expect(table.stdout).To(MatchRegexp(`prod/db\s+node-1\s+node-2`))
	})

	It("shows drift between what manifests store and the decisions with --drift", func() {
		r := run("", "eval", "--drift", "examples/migratability")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		var out struct {
			Drift []struct {
				Kind, Object, Field string
				Stored, Decided     any
			} `json:"drift"`
		}
		Expect(json.Unmarshal([]byte(r.stdout), &out)).To(Succeed())
		nodes := []string{}
		for _, d := range out.Drift {
			if d.Kind == "Node" {
				Expect(d.Field).To(Equal("metadata.labels.kubevirt/host-model-migratability-level"))
				nodes = append(nodes, d.Object)
			}
		}
		// The example's nodes carry no level label: every host-model node drifts.
		Expect(slices.Sorted(slices.Values(nodes))).To(Equal([]string{"cascadelake-1", "cascadelake-2", "icelake-1", "skylake-1", "skylake-2"}))
	})
})
