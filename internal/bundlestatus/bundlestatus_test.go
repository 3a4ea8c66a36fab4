package bundlestatus_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlestatus"
	virtrego "github.com/virt-rules/virt-rules/rego"
)

func bundleWithPrecedence(t *testing.T, precedence string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "virtrules/migration/policy/data.json")
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.Replace(string(b), `"precedence": "default"`, `"precedence": "`+precedence+`"`, 1))
	if err := os.WriteFile(data, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Drop the shipped tests: they pin the shipped settings.
	filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "_test.rego") {
			os.Remove(p)
		}
		return err
	})
	return dir
}

func TestMetricsAndEventsFollowTheEngine(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s, err := bundlestatus.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, "virtrules_bundle_seconds_since_last_activation"); v != -1 {
		t.Errorf("seconds since last activation before any: %v, want -1", v)
	}
	e, err := engine.New(ctx, engine.WithBundleEvents(s.Observe))
	if err != nil {
		t.Fatal(err)
	}
	embedded := e.Revision()
	rec := record.NewFakeRecorder(10)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-0", Namespace: "virt-rules"}}
	s.RecordEventsOn(rec, pod)
	expectEvent(t, rec, "Normal BundleActivated Bundle revision "+embedded+" from embedded activated")

	kubevirt := bundleWithPrecedence(t, "kubevirt")
	if err := e.LoadPath(ctx, kubevirt); err != nil {
		t.Fatal(err)
	}
	swapped := e.Revision()
	expectEvent(t, rec, "Normal BundleActivated Bundle revision "+swapped+" from "+kubevirt+" activated, replacing revision "+embedded)

	if err := e.LoadPath(ctx, bundleWithPrecedence(t, "fastest")); err == nil {
		t.Fatal("invalid settings accepted")
	}
	expectEvent(t, rec, "Warning BundleRefused Bundle from")
	if err := e.LoadPath(ctx, filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing bundle accepted")
	}
	expectEvent(t, rec, "Warning BundleRefused")

	want := `
# HELP virtrules_bundle_active_revision 1 for the revision of the Rego bundle serving decisions, labelled with where it came from.
# TYPE virtrules_bundle_active_revision gauge
virtrules_bundle_active_revision{revision="` + swapped + `",source="` + kubevirt + `"} 1
# HELP virtrules_bundle_load_failures_total Rego bundles not activated (the previous one kept serving), or refused while serving and replaced by the one before (budget), by reason: download, signature, read, compile, decisions, settings, test, trial, budget, prepare, persist.
# TYPE virtrules_bundle_load_failures_total counter
virtrules_bundle_load_failures_total{reason="read"} 1
virtrules_bundle_load_failures_total{reason="settings"} 1
# HELP virtrules_bundle_load_successes_total Rego bundles activated.
# TYPE virtrules_bundle_load_successes_total counter
virtrules_bundle_load_successes_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"virtrules_bundle_active_revision", "virtrules_bundle_load_failures_total", "virtrules_bundle_load_successes_total"); err != nil {
		t.Error(err)
	}
	since := gauge(t, reg, "virtrules_bundle_seconds_since_last_activation")
	if since < 0 || since > 60 {
		t.Errorf("seconds since last activation %v", since)
	}
	if ts := gauge(t, reg, "virtrules_bundle_last_activation_timestamp_seconds"); ts < 1e9 {
		t.Errorf("last activation timestamp %v", ts)
	}
}

// TestBudgetMetricsAndEvents: a bundle whose live decisions break their budget is counted by
// decision and budget, refused while serving, and the one before it restored, with Events.
func TestBudgetMetricsAndEvents(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s, err := bundlestatus.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(ctx, engine.WithBundleEvents(s.Observe), engine.WithBudgetEvents(s.ObserveBudget),
		engine.WithDecisionBudget(engine.Budget{Timeout: 5 * time.Second, Memory: 32 << 20}), engine.WithBundleRevert(1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	embedded := e.Revision()
	rec := record.NewFakeRecorder(10)
	s.RecordEventsOn(rec, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-0", Namespace: "virt-rules"}})
	expectEvent(t, rec, "Normal BundleActivated")

	// Costly only for VMIs labelled costly=true, which the trial's inputs are not.
	dir := bundleWithPrecedence(t, "default")
	module := filepath.Join(dir, "virtrules/migration/policy/policy.rego")
	b, err := os.ReadFile(module)
	if err != nil {
		t.Fatal(err)
	}
	// The decision's body starts with the added condition.
	const body = "\"configuration\": _winner.configuration} if {\n"
	if !strings.Contains(string(b), body) {
		t.Fatalf("%s has no %q", module, body)
	}
	costly := strings.Replace(string(b), body, body+"\t_affordable\n", 1) +
		"\n_affordable if not input.vmi.metadata.labels.costly\n\n_affordable if count([x | some x in numbers.range(1, 100000000)]) > 0\n"
	if err := os.WriteFile(module, []byte(costly), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.LoadPath(ctx, dir); err != nil {
		t.Fatal(err)
	}
	sneaky := e.Revision()
	expectEvent(t, rec, "Normal BundleActivated")
	set, err := e.MigrationPolicies(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = set.Decide(ctx, engine.MigrationPolicySubject{Namespace: "ns", Name: "vmi", Labels: map[string]string{"costly": "true"}})
	if !errors.Is(err, engine.ErrBudgetExceeded) {
		t.Fatalf("costly decision: %v, want over budget", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.Revision() != embedded && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if e.Revision() != embedded {
		t.Fatalf("serving %s, want the embedded bundle restored", e.Revision())
	}
	expectEvent(t, rec, "Warning BundleRefused Bundle revision "+sneaky+" from "+dir+" refused while serving (budget): bundle refused: "+dir+
		": serve: 1 decisions broke their budget within 1m0s, the last: decision over budget: the heap grew by")
	expectEvent(t, rec, "Normal BundleActivated Bundle revision "+embedded+" from embedded restored, replacing revision "+sneaky+", refused for breaking its decision budget")
	want := `
# HELP virtrules_bundle_active_revision 1 for the revision of the Rego bundle serving decisions, labelled with where it came from.
# TYPE virtrules_bundle_active_revision gauge
virtrules_bundle_active_revision{revision="` + embedded + `",source="embedded"} 1
# HELP virtrules_decision_budget_exceeded_total Evaluations of a decision stopped for breaking their budget (time or memory), by decision (the Rego entrypoint, such as migration.policy) and budget.
# TYPE virtrules_decision_budget_exceeded_total counter
virtrules_decision_budget_exceeded_total{budget="memory",decision="migration.policy"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"virtrules_bundle_active_revision", "virtrules_decision_budget_exceeded_total"); err != nil {
		t.Error(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "virtrules_bundle_load_failures_total"); err == nil {
		t.Error("no refusal counted")
	} else if !strings.Contains(err.Error(), `virtrules_bundle_load_failures_total{reason="budget"} 1`) {
		t.Errorf("refusals counted: %v", err)
	}
}

func expectEvent(t *testing.T, rec *record.FakeRecorder, prefix string) {
	t.Helper()
	select {
	case got := <-rec.Events:
		if !strings.HasPrefix(got, prefix) {
			t.Errorf("event %q, want %q...", got, prefix)
		}
	default:
		t.Errorf("no event, want %q...", prefix)
	}
}

// gauge is the value of the registered gauge name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestCandidateMetricsAndEvents: the candidate bundle's activations and refusals go to the
// virtrules_candidate_bundle_* siblings, beside the active bundle's on the same registry, with
// Events of their own reasons; the same refusal again is counted but not recorded again.
func TestCandidateMetricsAndEvents(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	if _, err := bundlestatus.New(reg); err != nil {
		t.Fatal(err)
	}
	s, err := bundlestatus.NewCandidate(reg)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(ctx, engine.WithBundleEvents(s.Observe))
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for range 3 {
		if err := e.LoadPath(ctx, missing); err == nil {
			t.Fatal("missing bundle accepted")
		}
	}
	// What happened before Events could be recorded is recorded now.
	rec := record.NewFakeRecorder(10)
	s.RecordEventsOn(rec, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-0", Namespace: "virt-rules"}})
	expectEvent(t, rec, "Normal CandidateBundleActivated Candidate bundle revision "+e.Revision()+" from embedded activated")
	if err := e.LoadPath(ctx, missing); err == nil {
		t.Fatal("missing bundle accepted")
	}
	expectEvent(t, rec, "Warning CandidateBundleRefused Candidate bundle from "+missing+" refused (read), revision "+e.Revision()+" stays the candidate compared")
	select {
	case got := <-rec.Events:
		t.Errorf("the same refusal recorded again: %q", got)
	default:
	}
	if err := e.LoadPath(ctx, bundleWithPrecedence(t, "fastest")); err == nil {
		t.Fatal("invalid settings accepted")
	}
	expectEvent(t, rec, "Warning CandidateBundleRefused Candidate bundle from")

	want := `
# HELP virtrules_candidate_bundle_load_failures_total Rego bundles not activated (the previous one kept serving), or refused while serving and replaced by the one before (budget), by reason: download, signature, read, compile, decisions, settings, test, trial, budget, prepare, persist.
# TYPE virtrules_candidate_bundle_load_failures_total counter
virtrules_candidate_bundle_load_failures_total{reason="read"} 4
virtrules_candidate_bundle_load_failures_total{reason="settings"} 1
# HELP virtrules_candidate_bundle_load_successes_total Rego bundles activated.
# TYPE virtrules_candidate_bundle_load_successes_total counter
virtrules_candidate_bundle_load_successes_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"virtrules_candidate_bundle_load_failures_total", "virtrules_candidate_bundle_load_successes_total",
		"virtrules_bundle_load_failures_total"); err != nil {
		t.Error(err)
	}
	if v := gauge(t, reg, "virtrules_bundle_seconds_since_last_activation"); v != -1 {
		t.Errorf("the active bundle's metrics moved: seconds since last activation %v, want -1", v)
	}
}
