package engine_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virt-rules/virt-rules/engine"
	virtrego "github.com/virt-rules/virt-rules/rego"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The differential test decides thousands of generated VMIs with the engine and with the
// plain Go reference (test/reference, written from the specification) and wants the same
// policy, number of matching labels and configuration, in both precedence modes.

var migrationPolicySeed = flag.Uint64("migrationpolicy.seed", 861916, "seed of the MigrationPolicy differential test")

const (
	diffPolicySets   = 30  // random policy sets per mode
	diffVMIsPerSet   = 100 // VMIs decided against each set
	diffMaxPolicies  = 40
	policyDataPath   = "virtrules/migration/policy/data.json"
	policyAPIVersion = "migrations.kubevirt.io/v1alpha1"
)

func TestMigrationPolicyDifferential(t *testing.T) {
	seed := *migrationPolicySeed
	t.Logf("seed %d (rerun with -migrationpolicy.seed=%d)", seed, seed)
	for _, mode := range []reference.Mode{reference.ModeDefault, reference.ModeKubeVirt} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			eng, settings := precedenceEngine(t, mode)
			gen := &diffGen{r: rand.New(rand.NewPCG(seed, 0))}
			covered := map[string]int{}
			for set := range diffPolicySets {
				in := diffInput{Policies: gen.policies(1 + gen.r.IntN(diffMaxPolicies)), KubeVirt: gen.kubevirt()}
				mp, err := eng.MigrationPolicies(in.Policies, in.KubeVirt)
				if err != nil {
					t.Fatal(err)
				}
				ref, cluster := referenceInputs(t, in, settings)
				for i := range diffVMIsPerSet {
					in.VMI = gen.vmi(fmt.Sprintf("vmi-%d-%d", set, i))
					got, err := mp.Decide(ctx, in.VMI)
					want := reference.Decide(ref, referenceVMI(in.VMI), settings, cluster)
					if err != nil || !sameDecision(got, want) {
						reportDisagreement(t, eng, settings, in)
						return
					}
					coverDecision(covered, ref, in.VMI, want, mode)
				}
			}
			t.Logf("%d decisions: %v", diffPolicySets*diffVMIsPerSet, covered)
			for _, what := range wantCovered(mode) {
				if covered[what] == 0 {
					t.Errorf("no generated input exercised %q; the generator needs adjusting", what)
				}
			}
		})
	}
}

// precedenceEngine serves the embedded bundle with its precedence setting replaced by mode,
// and returns the bundle settings the reference should use.
func precedenceEngine(t *testing.T, mode reference.Mode, opts ...engine.Option) (*engine.Engine, reference.Settings) {
	t.Helper()
	ctx := context.Background()
	raw, err := fs.ReadFile(virtrego.Bundle(), policyDataPath)
	if err != nil {
		t.Fatal(err)
	}
	settings, err := reference.ParseSettings(raw)
	if err != nil {
		t.Fatal(err)
	}
	if settings.Precedence == mode {
		eng, err := engine.New(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return eng, settings
	}
	dir := bundleDir(t, func(dir string) { setPrecedence(t, dir, raw, mode) })
	eng, err := engine.New(ctx, append(opts, engine.WithBundlePath(dir))...)
	if err != nil {
		t.Fatal(err)
	}
	settings.Precedence = mode
	return eng, settings
}

// setPrecedence rewrites the bundle copy in dir to use mode. It removes the bundle's Rego
// tests: they are written for the shipped settings and ran against them already.
func setPrecedence(t *testing.T, dir string, dataJSON []byte, mode reference.Mode) {
	t.Helper()
	var data map[string]any
	if err := json.Unmarshal(dataJSON, &data); err != nil {
		t.Fatal(err)
	}
	data["settings"].(map[string]any)["precedence"] = string(mode)
	raw, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, filepath.FromSlash(policyDataPath)), string(raw))
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, "_test.rego") {
			err = os.Remove(path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// diffInput is one decision's input, as the engine receives it.
type diffInput struct {
	Policies []*unstructured.Unstructured  `json:"policies"`
	KubeVirt *unstructured.Unstructured    `json:"kubevirt"`
	VMI      engine.MigrationPolicySubject `json:"vmi"`
}

func referenceInputs(tb testing.TB, in diffInput, settings reference.Settings) ([]reference.Policy, kubevirtv1.VMIMConfigurationOptions) {
	tb.Helper()
	policies, err := reference.PoliciesFromUnstructured(in.Policies, settings.PolicyFields)
	if err != nil {
		tb.Fatal(err)
	}
	cluster, err := reference.ClusterConfiguration(in.KubeVirt)
	if err != nil {
		tb.Fatal(err)
	}
	return policies, cluster
}

func referenceVMI(s engine.MigrationPolicySubject) reference.VMI {
	return reference.VMI{Namespace: s.Namespace, Labels: s.Labels, NamespaceLabels: s.NamespaceLabels}
}

// decisionText renders a decision for comparison and for people: the configuration as JSON,
// so that equal quantities compare equal however they were parsed.
func decisionText(policy string, matching int, configuration any) string {
	raw, err := json.Marshal(configuration)
	if err != nil {
		return fmt.Sprintf("policy %q, %d matching labels, configuration: %v", policy, matching, err)
	}
	return fmt.Sprintf("policy %q, %d matching labels, configuration %s", policy, matching, raw)
}

func engineText(d *engine.MigrationPolicyDecision) string {
	return decisionText(d.Policy, d.MatchingLabels, d.Configuration)
}

func referenceText(d reference.Decision) string {
	return decisionText(d.Policy, d.MatchingLabels, d.Configuration)
}

func sameDecision(got *engine.MigrationPolicyDecision, want reference.Decision) bool {
	return engineText(got) == referenceText(want)
}

// disagrees decides in with both implementations and describes the difference, "" if none.
func disagrees(tb testing.TB, eng *engine.Engine, settings reference.Settings, in diffInput) string {
	tb.Helper()
	ref, cluster := referenceInputs(tb, in, settings)
	wantText := referenceText(reference.Decide(ref, referenceVMI(in.VMI), settings, cluster))
	mp, err := eng.MigrationPolicies(in.Policies, in.KubeVirt)
	if err != nil {
		return fmt.Sprintf("engine: %v\nreference: %s", err, wantText)
	}
	got, err := mp.Decide(context.Background(), in.VMI)
	if err != nil {
		return fmt.Sprintf("engine: %v\nreference: %s", err, wantText)
	}
	if gotText := engineText(got); gotText != wantText {
		return fmt.Sprintf("engine:    %s\nreference: %s", gotText, wantText)
	}
	return ""
}

// reportDisagreement shrinks in to an input that still disagrees, dropping one policy,
// label or configuration at a time, and reports it.
func reportDisagreement(t *testing.T, eng *engine.Engine, settings reference.Settings, in diffInput) {
	t.Helper()
	// Every candidate is strictly smaller, so this ends. After a success the candidate at
	// the same position is the next one to try.
	for shrunk := true; shrunk; {
		shrunk = false
		candidates := shrinkCandidates(in)
		for i := 0; i < len(candidates); i++ {
			if disagrees(t, eng, settings, candidates[i]) != "" {
				in, shrunk = candidates[i], true
				candidates = shrinkCandidates(in)
				i--
			}
		}
	}
	raw, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Errorf("precedence %s: engine and reference disagree; minimal input:\n%s\n%s",
		settings.Precedence, raw, disagrees(t, eng, settings, in))
}

// shrinkCandidates are the inputs one step smaller than in: without a policy, a field of a
// policy or of the KubeVirt CR, or a label.
func shrinkCandidates(in diffInput) []diffInput {
	var out []diffInput
	for i, p := range in.Policies {
		smaller := in
		smaller.Policies = slices.Delete(slices.Clone(in.Policies), i, i+1)
		out = append(out, smaller)
		for _, path := range leafPaths(p.Object["spec"], []string{"spec"}) {
			smaller := in
			smaller.Policies = slices.Clone(in.Policies)
			smaller.Policies[i] = withoutField(p, path)
			out = append(out, smaller)
		}
	}
	if in.KubeVirt != nil {
		smaller := in
		smaller.KubeVirt = nil
		out = append(out, smaller)
		for _, path := range leafPaths(in.KubeVirt.Object["spec"], []string{"spec"}) {
			smaller := in
			smaller.KubeVirt = withoutField(in.KubeVirt, path)
			out = append(out, smaller)
		}
	}
	for key := range in.VMI.Labels {
		smaller := in
		smaller.VMI.Labels = withoutKey(in.VMI.Labels, key)
		out = append(out, smaller)
	}
	for key := range in.VMI.NamespaceLabels {
		smaller := in
		smaller.VMI.NamespaceLabels = withoutKey(in.VMI.NamespaceLabels, key)
		out = append(out, smaller)
	}
	if in.VMI.NamespaceLabels != nil {
		smaller := in
		smaller.VMI.NamespaceLabels = nil
		out = append(out, smaller)
	}
	return out
}

// leafPaths lists the paths to the fields under v, a map, whose values are not non-empty maps.
func leafPaths(v any, prefix []string) [][]string {
	m, _ := v.(map[string]any)
	var paths [][]string
	for _, key := range slices.Sorted(maps.Keys(m)) {
		path := append(slices.Clone(prefix), key)
		if sub, ok := m[key].(map[string]any); ok && len(sub) > 0 {
			paths = append(paths, leafPaths(sub, path)...)
		} else {
			paths = append(paths, path)
		}
	}
	return paths
}

func withoutField(obj *unstructured.Unstructured, path []string) *unstructured.Unstructured {
	out := obj.DeepCopy()
	unstructured.RemoveNestedField(out.Object, path...)
	return out
}

func withoutKey(m map[string]string, key string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// coverDecision counts which rule decided, so the test can tell that the generated inputs
// reach every rule.
func coverDecision(covered map[string]int, policies []reference.Policy, vmi engine.MigrationPolicySubject, d reference.Decision, mode reference.Mode) {
	ranked := reference.Ranked(policies, referenceVMI(vmi), mode)
	switch {
	case len(ranked) == 0:
		covered["no match"]++
	case len(ranked) == 1:
		covered["single match"]++
	default:
		covered["tie broken by "+decidingRule(ranked[0], ranked[1], mode)]++
	}
	if len(ranked) > 0 {
		if _, ok := ranked[0].Namespace[reference.NamespaceNameLabel]; ok {
			covered["namespace name label"]++
		}
	}
	if c := d.Configuration; c.AllowWorkloadDisruption != nil && c.AllowPostCopy != nil && *c.AllowWorkloadDisruption != *c.AllowPostCopy {
		covered["workload disruption unlike post-copy"]++
	}
	if d.Configuration.ExperimentalMigrationOptions != nil {
		covered["experimental options"]++
	}
	subject := referenceVMI(vmi)
	for i := range policies {
		p := policies[i]
		if p.NoSelectors {
			p.NoSelectors = false
			if p.Matches(subject, reference.ModeDefault) {
				covered["no selectors, labels would match"]++
			}
		}
	}
	if len(ranked) > 0 && hasEmptyRequirement(ranked[0]) {
		covered["winner requires a value \"\""]++
	}
}

func hasEmptyRequirement(p *reference.Policy) bool {
	for _, reqs := range []map[string]string{p.VMI, p.Namespace} {
		for _, v := range reqs {
			if v == "" {
				return true
			}
		}
	}
	return false
}

func decidingRule(winner, second *reference.Policy, mode reference.Mode) string {
	switch {
	case winner.Requirements() != second.Requirements():
		return "matching labels"
	case mode == reference.ModeDefault && !slices.Equal(winner.SortedKeys(), second.SortedKeys()):
		return "label keys"
	case len(winner.VMI) != len(second.VMI):
		return "VMI labels"
	}
	return "name"
}

func wantCovered(mode reference.Mode) []string {
	want := []string{
		"no match", "single match", "tie broken by matching labels", "tie broken by VMI labels",
		"tie broken by name", "namespace name label", "workload disruption unlike post-copy",
		"experimental options", "no selectors, labels would match", `winner requires a value ""`,
	}
	if mode == reference.ModeDefault {
		want = append(want, "tie broken by label keys")
	}
	return want
}

// Generated inputs. -----------------------------------------------------------------------

// Small pools, so that policies match often and tie often. "tier" and "app" are used by both
// selectors; the namespace name label may be required, derived or set explicitly.
var (
	diffVMIKeys       = []string{"app", "tier", "os", "gpu"}
	diffNamespaceKeys = []string{"team", "env", "tier", "app", reference.NamespaceNameLabel}
	diffValues        = []string{"a", "b", ""} // "" is any value in design 000, itself in KubeVirt
	diffNamespaces    = []string{"ns-a", "ns-b", "ns-c"}
)

// migrationFields generate a value for every MigrationConfiguration field, policy field or not.
var migrationFields = map[string]func(r *rand.Rand) any{
	"nodeDrainTaintKey":                 func(r *rand.Rand) any { return oneOf(r, []string{"kubevirt.io/drain", "example.com/drain"}) },
	"parallelOutboundMigrationsPerNode": func(r *rand.Rand) any { return int64(1 + r.IntN(4)) },
	"parallelMigrationsPerCluster":      func(r *rand.Rand) any { return int64(1 + r.IntN(10)) },
	"allowAutoConverge":                 func(r *rand.Rand) any { return r.IntN(2) == 0 },
	"bandwidthPerMigration":             func(r *rand.Rand) any { return oneOf(r, []string{"0", "64Mi", "1Gi", "1024Mi"}) },
	"completionTimeoutPerGiB":           func(r *rand.Rand) any { return int64(r.IntN(300)) },
	"maxDowntimeMs":                     func(r *rand.Rand) any { return int64(1 + r.IntN(2000)) },
	"progressTimeout":                   func(r *rand.Rand) any { return int64(r.IntN(300)) },
	"utilityVolumesTimeout":             func(r *rand.Rand) any { return int64(r.IntN(300)) },
	"unsafeMigrationOverride":           func(r *rand.Rand) any { return r.IntN(2) == 0 },
	"allowPostCopy":                     func(r *rand.Rand) any { return r.IntN(2) == 0 },
	"allowWorkloadDisruption":           func(r *rand.Rand) any { return r.IntN(2) == 0 },
	"disableTLS":                        func(r *rand.Rand) any { return r.IntN(2) == 0 },
	"network":                           func(r *rand.Rand) any { return oneOf(r, []string{"migration", "storage"}) },
	"matchSELinuxLevelOnMigration":      func(r *rand.Rand) any { return r.IntN(2) == 0 },
	"experimental":                      experimentalOptions,
}

// experimentalOptions are KubeVirt v1.9's experimental migration options, some fields null.
func experimentalOptions(r *rand.Rand) any {
	options := map[string]any{}
	if r.IntN(2) == 0 {
		options["compression"] = oneOf(r, []any{"none", "zstd", nil})
	}
	if r.IntN(3) != 0 {
		stall := map[string]any{}
		for field, value := range map[string]any{
			"stallMargin": int64(r.IntN(101)), "ewmaAlpha": oneOf(r, []string{"0.4", "1"}),
			"switchoverTimeout": int64(r.IntN(120)), "searchLocalMinima": r.IntN(2) == 0,
			"completionTimeoutFactor": nil,
		} {
			if r.IntN(2) == 0 {
				stall[field] = value
			}
		}
		options["stallDetector"] = stall
	}
	return options
}

func oneOf[T any](r *rand.Rand, from []T) T { return from[r.IntN(len(from))] }

type diffGen struct{ r *rand.Rand }

// configuration sets each field with probability p, sometimes to an explicit null.
func (g *diffGen) configuration(p float64) map[string]any {
	cfg := map[string]any{}
	for _, field := range slices.Sorted(maps.Keys(migrationFields)) {
		switch x := g.r.Float64(); {
		case x < p:
			cfg[field] = migrationFields[field](g.r)
		case x < p*1.2:
			cfg[field] = nil
		}
	}
	return cfg
}

// requirements draws up to max requirements from keys, a quarter of them key-only.
func (g *diffGen) requirements(keys []string, max int) map[string]string {
	reqs := map[string]string{}
	for range g.r.IntN(max + 1) {
		key := oneOf(g.r, keys)
		switch {
		case g.r.IntN(4) == 0:
			reqs[key] = ""
		case key == reference.NamespaceNameLabel:
			reqs[key] = oneOf(g.r, diffNamespaces)
		default:
			reqs[key] = oneOf(g.r, diffValues)
		}
	}
	return reqs
}

// selector writes reqs in one of the shapes a stored policy may use; nil means absent.
func (g *diffGen) selector(reqs map[string]string) any {
	plain := map[string]any{}
	for k, v := range reqs {
		plain[k] = v
	}
	switch {
	case len(reqs) == 0 && g.r.IntN(3) == 0:
		return nil
	case g.r.IntN(2) == 0:
		return plain
	}
	return map[string]any{"matchLabels": plain}
}

func (g *diffGen) policies(n int) []*unstructured.Unstructured {
	names := g.r.Perm(n) // names unrelated to generation order
	policies := make([]*unstructured.Unstructured, 0, n)
	var vmiReqs, nsReqs map[string]string
	for i := range n {
		// Now and then a policy with the same selectors as the previous one: only the
		// name can tell them apart.
		if i == 0 || g.r.IntN(8) != 0 {
			vmiReqs, nsReqs = g.requirements(diffVMIKeys, 3), g.requirements(diffNamespaceKeys, 2)
		}
		name := fmt.Sprintf("policy-%02d", names[i])
		if g.r.IntN(12) == 0 { // no spec.selectors (absent or null): matches no VMI
			policies = append(policies, policyWithSelectors(name, nil, g.configuration(0.25)))
			if g.r.IntN(2) == 0 {
				policies[len(policies)-1].Object["spec"].(map[string]any)["selectors"] = nil
			}
			continue
		}
		policies = append(policies, policyObject(name, g.selector(vmiReqs), g.selector(nsReqs), g.configuration(0.25)))
	}
	return policies
}

func (g *diffGen) kubevirt() *unstructured.Unstructured {
	spec := map[string]any{}
	switch g.r.IntN(5) {
	case 0:
		return nil
	case 1: // a KubeVirt CR without migration configuration
	default:
		spec["configuration"] = map[string]any{"migrations": g.configuration(0.3)}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "KubeVirt",
		"metadata":   map[string]any{"name": "kubevirt", "namespace": "kubevirt"},
		"spec":       spec,
	}}
}

func (g *diffGen) vmi(name string) engine.MigrationPolicySubject {
	s := engine.MigrationPolicySubject{Namespace: oneOf(g.r, diffNamespaces), Name: name, Labels: map[string]string{}}
	// One VMI in 10 has no labels at all, which KubeVirt's precedence reads apart.
	labelled := g.r.IntN(10) != 0
	for _, key := range diffVMIKeys {
		if labelled && g.r.IntN(4) != 0 {
			s.Labels[key] = oneOf(g.r, diffValues)
		}
	}
	if g.r.IntN(6) == 0 {
		return s // namespace unknown: only its name label
	}
	s.NamespaceLabels = map[string]string{}
	for _, key := range diffNamespaceKeys {
		switch {
		case key != reference.NamespaceNameLabel && g.r.IntN(4) != 0:
			s.NamespaceLabels[key] = oneOf(g.r, diffValues)
		case key == reference.NamespaceNameLabel && g.r.IntN(8) == 0:
			s.NamespaceLabels[key] = oneOf(g.r, diffNamespaces) // overrides the derived one
		}
	}
	return s
}

// policyObject builds a MigrationPolicy as stored; nil selectors are left out.
func policyObject(name string, vmiSelector, nsSelector any, configuration map[string]any) *unstructured.Unstructured {
	selectors := map[string]any{}
	if vmiSelector != nil {
		selectors["virtualMachineInstanceSelector"] = vmiSelector
	}
	if nsSelector != nil {
		selectors["namespaceSelector"] = nsSelector
	}
	return policyWithSelectors(name, selectors, configuration)
}

// policyWithSelectors builds a MigrationPolicy as stored with spec.selectors as given; nil
// leaves the field out.
func policyWithSelectors(name string, selectors any, configuration map[string]any) *unstructured.Unstructured {
	spec := map[string]any{}
	if selectors != nil {
		spec["selectors"] = selectors
	}
	for k, v := range configuration {
		spec[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policyAPIVersion,
		"kind":       "MigrationPolicy",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}
