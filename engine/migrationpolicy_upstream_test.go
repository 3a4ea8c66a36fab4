package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The upstream differential suite: cases written from what KubeVirt v1.9.0's unit tests and
// code establish about MigrationPolicies (pkg/virt-controller/watch/migration: matchPolicy,
// countMatchingLabels, applyMigrationPolicySpec and their tests in migration_test.go and
// migrationpolicy_test.go; pkg/virt-api/webhooks/validating-webhook/admitters:
// migrationpolicy-admitter.go and its test; the MigrationPolicy CRD's bounds), with fixtures of
// our own. Every case runs on the shipped bundle (precedence "default") and with precedence
// "kubevirt", on the engine and, for decisions, on the Go reference.
//
// A case's class is either
//   - agrees: both modes give KubeVirt's answer, or
//   - differs by documented choice: the default mode gives design 000's answer on purpose
//     (README, "Decisions and their contracts"); the kubevirt mode gives KubeVirt's.

// upstreamDecisionCase is one VMI, its namespace's labels and the policies.
type upstreamDecisionCase struct {
	name     string
	class    string
	vmi      map[string]string
	ns       map[string]string
	policies []*unstructured.Unstructured
	kubevirt map[string]any // spec.configuration.migrations; nil for no KubeVirt CR
	// want is KubeVirt's winner, "" for none; wantDefault the default mode's when the case
	// differs by documented choice.
	want, wantDefault string
	// check, when set, checks the configuration (in both modes).
	check func(kubevirtv1.VMIMConfigurationOptions) error
}

func sel(vmi, ns map[string]string) map[string]any {
	out := map[string]any{}
	if vmi != nil {
		out["virtualMachineInstanceSelector"] = toAny(vmi)
	}
	if ns != nil {
		out["namespaceSelector"] = toAny(ns)
	}
	return out
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// numbered is n labels key-<prefix>-<i>=value-<i>, as a VMI or namespace would carry them.
func numbered(prefix string, n int) map[string]string {
	out := map[string]string{}
	for i := range n {
		out[fmt.Sprintf("%s-key-%d", prefix, i)] = fmt.Sprintf("value-%d", i)
	}
	return out
}

func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func want[T comparable](field string, got *T, value T) error {
	if got == nil || *got != value {
		return fmt.Errorf("%s: got %v, want %v", field, deref(got), value)
	}
	return nil
}

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

func upstreamDecisionCases() []upstreamDecisionCase {
	p := policyWithSelectors
	// The VMI and namespace of the precedence cases: enough numbered labels for every policy.
	vmi := merged(numbered("vmi", 4), map[string]string{"size": "small", "os": "fedora", "tier": ""})
	ns := merged(numbered("ns", 4), map[string]string{"priority": "high", "bandwidth": "medium", "hpc-workload": "true"})
	two := func(name string, vmiN, nsN int) *unstructured.Unstructured {
		return p(name, sel(numbered("vmi", vmiN), numbered("ns", nsN)), nil)
	}
	return []upstreamDecisionCase{
		// migration_test.go, "matching and precedence".
		{name: "one policy matched", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{two("one", 1, 4)}, want: "one"},
		{name: "the most detailed policy wins", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{two("one", 1, 4), two("two", 4, 2)}, want: "two"},
		{name: "equally detailed: the first name (listed first)", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{two("aa", 2, 2), two("zz", 2, 2)}, want: "aa"},
		{name: "equally detailed: the first name (listed last)", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{two("zz", 2, 2), two("aa", 2, 2)}, want: "aa"},
		{name: "one label with another value: no match", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("off", sel(merged(numbered("vmi", 3), map[string]string{"vmi-key-3": "other"}), numbered("ns", 3)), nil)}},
		{name: "no policies: no match", class: classAgrees, vmi: vmi, ns: ns},
		// VMI labels before namespace labels at the same count. Here the VMI policy's keys also
		// sort first, so design 000's key order agrees...
		{name: "VMI labels before namespace labels", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{
				p("by-namespace", sel(nil, map[string]string{"priority": "high"}), nil),
				p("by-vmi", sel(map[string]string{"os": "fedora"}, nil), nil),
			}, want: "by-vmi"},
		// ...and here the namespace policy's keys sort first: design 000 takes them.
		{name: "VMI labels before namespace labels, namespace keys sorting first", class: classDiffers, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{
				p("by-namespace", sel(nil, map[string]string{"bandwidth": "medium"}), nil),
				p("by-vmi", sel(map[string]string{"size": "small"}, nil), nil),
			}, want: "by-vmi", wantDefault: "by-namespace"},
		// Design 000's own example: its two 4-label policies tie in KubeVirt up to the name.
		{name: "design 000's example", class: classDiffers, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{
				p("tuned-bandwidth", sel(map[string]string{"size": "small", "os": "fedora"}, map[string]string{"priority": "high", "bandwidth": "medium"}), nil),
				p("hpc-large", sel(map[string]string{"size": "small", "os": "fedora"}, map[string]string{"priority": "high", "hpc-workload": "true"}), nil),
			}, want: "hpc-large", wantDefault: "tuned-bandwidth"},

		// countMatchingLabels: a policy without spec.selectors never matches; empty ones match
		// every VMI, with no label.
		{name: "no spec.selectors: no match", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("none", nil, map[string]any{"allowAutoConverge": true})}},
		{name: "null spec.selectors: no match", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{nullSelectors(p("none", nil, nil))}},
		{name: "no spec.selectors loses to empty selectors", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("a-none", nil, nil), p("b-empty", map[string]any{}, nil)}, want: "b-empty"},
		{name: "empty selectors match every VMI", class: classAgrees, vmi: map[string]string{"app": "x"}, ns: nil,
			policies: []*unstructured.Unstructured{p("empty", sel(map[string]string{}, map[string]string{}), nil)}, want: "empty"},
		{name: "empty selectors lose to any label", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("a-empty", map[string]any{}, nil), p("z-one", sel(map[string]string{"os": "fedora"}, nil), nil)}, want: "z-one"},

		// countMatchingLabels compares a policy's selectors only with a VMI that has labels
		// (non-nil): a VMI without any matches every policy with spec.selectors, with 0 labels,
		// and the first name wins. Design 000 reads the selectors.
		{name: "VMI without labels: every policy with selectors ties", class: classDiffers, vmi: nil, ns: ns,
			policies: []*unstructured.Unstructured{
				p("a-none", nil, nil),
				p("c-empty", map[string]any{}, nil),
				p("b-gpu", sel(map[string]string{"gpu": "nvidia"}, map[string]string{"priority": "low"}), nil),
			}, want: "b-gpu", wantDefault: "c-empty"},

		// countMatchingLabels compares values as they are: "" is the empty value in KubeVirt,
		// any value in design 000.
		{name: `"" against a non-empty value`, class: classDiffers, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("any-os", sel(map[string]string{"os": ""}, nil), nil)}, want: "", wantDefault: "any-os"},
		{name: `"" against a namespace value`, class: classDiffers, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{
				p("any-priority", sel(nil, map[string]string{"priority": ""}), nil),
				p("small", sel(map[string]string{"size": "small"}, nil), nil),
			}, want: "small", wantDefault: "any-priority"},
		{name: `"" against an empty value`, class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("empty-tier", sel(map[string]string{"tier": ""}, nil), nil)}, want: "empty-tier"},
		{name: `"" against a missing label`, class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("gpu", sel(map[string]string{"gpu": ""}, nil), nil)}},

		// "should override cluster-wide migration configurations" and applyMigrationPolicySpec.
		{name: "policy allows auto-converge", class: classAgrees, vmi: vmi, ns: ns, kubevirt: map[string]any{"allowAutoConverge": false, "progressTimeout": int64(300)},
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"allowAutoConverge": true})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				if err := want("allowAutoConverge", c.AllowAutoConverge, true); err != nil {
					return err
				}
				return want("progressTimeout", c.ProgressTimeout, int64(300))
			}},
		{name: "policy denies auto-converge", class: classAgrees, vmi: vmi, ns: ns, kubevirt: map[string]any{"allowAutoConverge": true},
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"allowAutoConverge": false})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				return want("allowAutoConverge", c.AllowAutoConverge, false)
			}},
		{name: "policy sets bandwidth and completion timeout", class: classAgrees, vmi: vmi, ns: ns, kubevirt: map[string]any{"bandwidthPerMigration": "64Mi"},
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"bandwidthPerMigration": "25Mi", "completionTimeoutPerGiB": int64(33425)})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				if c.BandwidthPerMigration == nil || c.BandwidthPerMigration.String() != "25Mi" {
					return fmt.Errorf("bandwidthPerMigration: got %v, want 25Mi", deref(c.BandwidthPerMigration))
				}
				return want("completionTimeoutPerGiB", c.CompletionTimeoutPerGiB, int64(33425))
			}},
		{name: "policy allows workload disruption", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"allowWorkloadDisruption": true})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				return want("allowWorkloadDisruption", c.AllowWorkloadDisruption, true)
			}},
		{name: "policy post-copy off: disruption follows", class: classAgrees, vmi: vmi, ns: ns, kubevirt: map[string]any{"allowWorkloadDisruption": true},
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"allowPostCopy": false})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				if err := want("allowPostCopy", c.AllowPostCopy, false); err != nil {
					return err
				}
				return want("allowWorkloadDisruption", c.AllowWorkloadDisruption, false)
			}},
		{name: "policy post-copy on: disruption follows", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"allowPostCopy": true})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				return want("allowWorkloadDisruption", c.AllowWorkloadDisruption, true)
			}},
		{name: "policy sets max downtime", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"maxDowntimeMs": int64(300)})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				return want("maxDowntimeMs", c.MaxDowntimeMs, uint64(300))
			}},
		{name: "policy sets experimental options", class: classAgrees, vmi: vmi, ns: ns,
			policies: []*unstructured.Unstructured{p("p", sel(map[string]string{"os": "fedora"}, nil), map[string]any{"experimental": map[string]any{
				"compression":   "zstd",
				"stallDetector": map[string]any{"stallMargin": int64(8), "precopyPossibleFactor": "2", "searchLocalMinima": false, "ewmaAlpha": nil},
			}})}, want: "p",
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				e := c.ExperimentalMigrationOptions
				if e == nil || e.StallDetector == nil {
					return fmt.Errorf("experimental: got %+v, want compression and a stall detector", e)
				}
				if err := want("compression", e.Compression, kubevirtv1.MigrationCompressionZstd); err != nil {
					return err
				}
				if e.StallDetector.EwmaAlpha != nil {
					return fmt.Errorf("ewmaAlpha: got %v, want unset (null)", *e.StallDetector.EwmaAlpha)
				}
				if err := want("stallMargin", e.StallDetector.StallMargin, int64(8)); err != nil {
					return err
				}
				return want("precopyPossibleFactor", e.StallDetector.PrecopyPossibleFactor, "2")
			}},
		{name: "no policy: no experimental options", class: classAgrees, vmi: vmi, ns: ns, kubevirt: map[string]any{"allowAutoConverge": true},
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				if c.ExperimentalMigrationOptions != nil {
					return fmt.Errorf("experimental: got %+v, want unset", c.ExperimentalMigrationOptions)
				}
				return want("allowAutoConverge", c.AllowAutoConverge, true)
			}},
		// migration.go: an unset matchSELinuxLevelOnMigration gives the target the source's level.
		{name: "SELinux level matched unless the CR says otherwise", class: classAgrees, vmi: vmi, ns: ns,
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				return want("matchSELinuxLevelOnMigration", c.MatchSELinuxLevelOnMigration, true)
			}},
		{name: "SELinux level from the CR", class: classAgrees, vmi: vmi, ns: ns, kubevirt: map[string]any{"matchSELinuxLevelOnMigration": false},
			check: func(c kubevirtv1.VMIMConfigurationOptions) error {
				return want("matchSELinuxLevelOnMigration", c.MatchSELinuxLevelOnMigration, false)
			}},
	}
}

// numberedFirst is the first n of numbered(prefix, ...).

func nullSelectors(obj *unstructured.Unstructured) *unstructured.Unstructured {
	obj.Object["spec"].(map[string]any)["selectors"] = nil
	return obj
}

func kubevirtCR(migrations map[string]any) *unstructured.Unstructured {
	if migrations == nil {
		return nil
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "KubeVirt",
		"metadata":   map[string]any{"name": "kubevirt", "namespace": "kubevirt"},
		"spec":       map[string]any{"configuration": map[string]any{"migrations": migrations}},
	}}
}

// upstreamValidationCase is one MigrationPolicy for admission, beside others.
type upstreamValidationCase struct {
	name   string
	class  string
	policy *unstructured.Unstructured
	others []*unstructured.Unstructured
	// old is the version an update replaces (nil: a create); gates the KubeVirt CR's
	// featureGates (nil: no KubeVirt CR).
	old   *unstructured.Unstructured
	gates []any
	// allowed is KubeVirt's answer; allowedDefault the default mode's when the case differs.
	allowed, allowedDefault bool
	// field is the field of the violation expected when not allowed.
	field string
}

func upstreamValidationCases() []upstreamValidationCase {
	valid := sel(map[string]string{"app": "db"}, nil)
	spec := func(fields map[string]any) *unstructured.Unstructured {
		return policyWithSelectors("test-policy", valid, fields)
	}
	stall := func(fields map[string]any) *unstructured.Unstructured {
		return spec(map[string]any{"experimental": map[string]any{"stallDetector": fields}})
	}
	reject := func(name string, policy *unstructured.Unstructured, field string) upstreamValidationCase {
		return upstreamValidationCase{name: name, class: classAgrees, policy: policy, field: field}
	}
	accept := func(name string, policy *unstructured.Unstructured) upstreamValidationCase {
		return upstreamValidationCase{name: name, class: classAgrees, policy: policy, allowed: true}
	}
	// gated is a case with a KubeVirt CR of these feature gates, refused on field ("": admitted).
	gated := func(name string, policy, old *unstructured.Unstructured, gates []any, field string) upstreamValidationCase {
		return upstreamValidationCase{name: name, class: classAgrees, policy: policy, old: old, gates: gates, allowed: field == "", field: field}
	}
	const sd = "spec.experimental.stallDetector."
	return []upstreamValidationCase{
		// migrationpolicy-admitter_test.go, "should reject migration policy with".
		reject("negative bandwidth", spec(map[string]any{"bandwidthPerMigration": "-1230"}), "spec.bandwidthPerMigration"),
		reject("negative completion timeout", spec(map[string]any{"completionTimeoutPerGiB": int64(-1)}), "spec.completionTimeoutPerGiB"),
		reject("precopyPossibleFactor not a number", stall(map[string]any{"precopyPossibleFactor": "not-a-number"}), sd+"precopyPossibleFactor"),
		reject("precopyPossibleFactor below 1", stall(map[string]any{"precopyPossibleFactor": "0.5"}), sd+"precopyPossibleFactor"),
		reject("patienceWindowDecayFactor above 1", stall(map[string]any{"patienceWindowDecayFactor": "1.5"}), sd+"patienceWindowDecayFactor"),
		// The admitter's other bounds and the factor precision (ParseFactor, 3 places).
		reject("ewmaAlpha zero", stall(map[string]any{"ewmaAlpha": "0"}), sd+"ewmaAlpha"),
		reject("ewmaAlpha above 1", stall(map[string]any{"ewmaAlpha": "1.5"}), sd+"ewmaAlpha"),
		reject("completionTimeoutFactor below 1", stall(map[string]any{"completionTimeoutFactor": "0.9"}), sd+"completionTimeoutFactor"),
		reject("factor with 4 decimal places", stall(map[string]any{"patienceWindowDecayFactor": "0.1234"}), sd+"patienceWindowDecayFactor"),
		// The CRD schema's bounds (kubebuilder Minimum/Maximum/Enum in the v1.9 API types).
		reject("max downtime 0", spec(map[string]any{"maxDowntimeMs": int64(0)}), "spec.maxDowntimeMs"),
		reject("max downtime above 2,000,000", spec(map[string]any{"maxDowntimeMs": int64(2000001)}), "spec.maxDowntimeMs"),
		reject("stall margin above 100", stall(map[string]any{"stallMargin": int64(101)}), sd+"stallMargin"),
		reject("negative stall margin", stall(map[string]any{"stallMargin": int64(-1)}), sd+"stallMargin"),
		reject("unknown compression", spec(map[string]any{"experimental": map[string]any{"compression": "lz4"}}), "spec.experimental.compression"),

		// "should accept migration policy with".
		accept("positive bandwidth", spec(map[string]any{"bandwidthPerMigration": "10"})),
		accept("zero bandwidth", spec(map[string]any{"bandwidthPerMigration": "0"})),
		accept("positive completion timeout", spec(map[string]any{"completionTimeoutPerGiB": int64(1)})),
		accept("zero completion timeout", spec(map[string]any{"completionTimeoutPerGiB": int64(0)})),
		accept("max downtime 900", spec(map[string]any{"maxDowntimeMs": int64(900)})),
		accept("max downtime bounds", spec(map[string]any{"maxDowntimeMs": int64(2000000)})),
		accept("empty spec, no selectors", &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": policyAPIVersion, "kind": "MigrationPolicy",
			"metadata": map[string]any{"name": "test-policy"}, "spec": map[string]any{},
		}}),
		accept("completionTimeoutFactor without upper bound", stall(map[string]any{"completionTimeoutFactor": "3"})),
		accept("precopyPossibleFactor without upper bound", stall(map[string]any{"precopyPossibleFactor": "2"})),
		accept("ewmaAlpha 1, decay 0, margin bounds", stall(map[string]any{"ewmaAlpha": "1", "patienceWindowDecayFactor": "0", "stallMargin": int64(100)})),
		accept("zstd compression", spec(map[string]any{"experimental": map[string]any{"compression": "zstd"}})),

		// v1.9's admitter: setting or changing maxDowntimeMs or a stall detector needs the alpha
		// feature gate MigrationStallDetection in the KubeVirt CR; compression does not.
		gated("max downtime without the stall detection gate", spec(map[string]any{"maxDowntimeMs": int64(300)}), nil, []any{"LiveMigration"}, "spec.maxDowntimeMs"),
		gated("stall detector without the stall detection gate", stall(map[string]any{"stallMargin": int64(5)}), nil, []any{}, "spec.experimental.stallDetector"),
		gated("max downtime changed without the stall detection gate", spec(map[string]any{"maxDowntimeMs": int64(300)}), spec(map[string]any{"maxDowntimeMs": int64(900)}), []any{}, "spec.maxDowntimeMs"),
		gated("max downtime left as it was without the stall detection gate", spec(map[string]any{"maxDowntimeMs": int64(300), "allowPostCopy": true}), spec(map[string]any{"maxDowntimeMs": int64(300)}), []any{}, ""),
		gated("stall detector with the stall detection gate", stall(map[string]any{"stallMargin": int64(5)}), nil, []any{"MigrationStallDetection"}, ""),
		gated("compression without the stall detection gate", spec(map[string]any{"experimental": map[string]any{"compression": "zstd"}}), nil, []any{}, ""),

		// KubeVirt admits two policies with the same selectors (matchPolicy lets the name
		// decide); design 000 does not allow them.
		{name: "same selectors as another policy", class: classDiffers, policy: spec(nil),
			others:  []*unstructured.Unstructured{policyWithSelectors("other", valid, nil)},
			allowed: true, allowedDefault: false, field: "spec.selectors"},
		// Policies without selectors match nothing: never the same selectors.
		{name: "no selectors beside another without", class: classAgrees,
			policy:  policyWithSelectors("test-policy", nil, nil),
			others:  []*unstructured.Unstructured{policyWithSelectors("other", nil, nil)},
			allowed: true},
	}
}

func TestMigrationPolicyUpstreamDifferential(t *testing.T) {
	ctx := context.Background()
	counts := map[string]int{}
	for _, mode := range []reference.Mode{reference.ModeDefault, reference.ModeKubeVirt} {
		eng, settings := precedenceEngine(t, mode)
		t.Run(string(mode), func(t *testing.T) {
			for _, tc := range upstreamDecisionCases() {
				t.Run("decide/"+tc.name, func(t *testing.T) {
					wantPolicy := tc.want
					if tc.class == classDiffers && mode == reference.ModeDefault {
						wantPolicy = tc.wantDefault
					}
					in := diffInput{
						Policies: tc.policies,
						KubeVirt: kubevirtCR(tc.kubevirt),
						VMI:      engine.MigrationPolicySubject{Namespace: "upstream", Name: "vmi", Labels: tc.vmi, NamespaceLabels: tc.ns},
					}
					set, err := eng.MigrationPolicies(in.Policies, in.KubeVirt)
					if err != nil {
						t.Fatal(err)
					}
					got, err := set.Decide(ctx, in.VMI)
					if err != nil {
						t.Fatal(err)
					}
					if got.Policy != wantPolicy {
						t.Errorf("engine: policy %q, want %q", got.Policy, wantPolicy)
					}
					if diff := disagrees(t, eng, settings, in); diff != "" {
						t.Errorf("engine and reference disagree:\n%s", diff)
					}
					if tc.check != nil {
						if err := tc.check(got.Configuration); err != nil {
							t.Errorf("configuration: %v", err)
						}
					}
				})
			}
			for _, tc := range upstreamValidationCases() {
				t.Run("validate/"+tc.name, func(t *testing.T) {
					allowed := tc.allowed
					if tc.class == classDiffers && mode == reference.ModeDefault {
						allowed = tc.allowedDefault
					}
					admission := engine.MigrationPolicyAdmission{Policy: tc.policy, Old: tc.old}
					if tc.gates != nil {
						admission.KubeVirt = kubevirtCR(map[string]any{})
						admission.KubeVirt.Object["spec"].(map[string]any)["configuration"].(map[string]any)["developerConfiguration"] = map[string]any{"featureGates": tc.gates}
					}
					violations, err := eng.ValidateMigrationPolicyAdmission(ctx, admission, eng.ExistingMigrationPolicies(tc.others))
					if err != nil {
						t.Fatal(err)
					}
					if got := len(violations) == 0; got != allowed {
						t.Fatalf("allowed %v, want %v: %v", got, allowed, violations)
					}
					if !allowed {
						fields := make([]string, len(violations))
						for i, v := range violations {
							fields[i] = v.Field
						}
						if !slices.Equal(fields, []string{tc.field}) {
							t.Errorf("violations %v, want one on %s", violations, tc.field)
						}
					}
				})
			}
		})
	}
	for _, tc := range upstreamDecisionCases() {
		counts["decision "+tc.class]++
	}
	for _, tc := range upstreamValidationCases() {
		counts["validation "+tc.class]++
	}
	t.Logf("cases per class (each run in both modes): %v", counts)
}
