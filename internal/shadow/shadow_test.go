package shadow_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/shadow"
	virtrego "github.com/virt-rules/virt-rules/rego"
)

// decisions keeps what the shadow logs.
type decisions struct {
	mu  sync.Mutex
	all []*engine.Decision
}

func (d *decisions) LogDecision(_ context.Context, dec *engine.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, dec)
}

// kubevirtPrecedence is the shipped bundle with KubeVirt's precedence, as a directory.
func kubevirtPrecedence(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	settings := filepath.Join(dir, "virtrules", "migration", "policy", "data.json")
	data, err := os.ReadFile(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(settings, []byte(strings.Replace(string(data), `"precedence": "default"`, `"precedence": "kubevirt"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func policy(vmi, name string, labels int) *eval.Report {
	d := &engine.MigrationPolicyDecision{Policy: name, MatchingLabels: labels}
	return &eval.Report{MigrationPolicies: []eval.MigrationPolicyResult{eval.MigrationPolicyResultOf(vmi, d)}}
}

// A difference is counted, logged with both sides, kept for the reports of its namespace,
// and forgotten once the candidate decides the same again; the active side is never changed.
func TestCompareCountsLogsAndKeepsDifferences(t *testing.T) {
	ctx := context.Background()
	active, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	candidate, err := engine.New(ctx, engine.WithBundlePath(kubevirtPrecedence(t)))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	logged := &decisions{}
	s, err := shadow.New(active, candidate, shadow.Options{Registerer: reg, DecisionLog: logged})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Start(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	objects := []shadow.Object{{Namespace: "hpc", Name: "fedora-gpu"}}
	answer := "hpc-large"
	decide := func(context.Context) (*eval.Report, error) { return policy("hpc/fedora-gpu", answer, 4), nil }

	s.Compare(ctx, shadow.DecisionMigrationPolicies, objects, policy("hpc/fedora-gpu", "tuned-bandwidth", 4), decide)
	s.Wait()
	diffs := s.Differences("hpc")
	if len(diffs) != 1 {
		t.Fatalf("differences %+v, want one", diffs)
	}
	d := diffs[0]
	if d.Object != "hpc/fedora-gpu" || strings.Join(d.Fields, ",") != "policy" || d.CandidateRevision != candidate.Revision() {
		t.Errorf("difference %+v: want hpc/fedora-gpu, fields [policy], candidate revision %s", d, candidate.Revision())
	}
	if !strings.Contains(string(d.Active), `"tuned-bandwidth"`) || !strings.Contains(string(d.Candidate), `"hpc-large"`) {
		t.Errorf("sides %s / %s: want tuned-bandwidth / hpc-large", d.Active, d.Candidate)
	}
	if got := s.Differences(""); len(got) != 0 {
		t.Errorf("cluster-scoped differences %+v, want none", got)
	}
	if n := testutil.ToFloat64(diffCounter(t, reg)); n != 1 {
		t.Errorf("differences counted %v, want 1", n)
	}
	if len(logged.all) != 1 || logged.all[0].Name != "candidate.migrationPolicies" {
		t.Fatalf("decision log %+v: want one candidate.migrationPolicies event", logged.all)
	}
	result, err := ast.JSON(logged.all[0].Result.Value)
	if err != nil {
		t.Fatal(err)
	}
	sides := result.(map[string]any)
	if p := sides["candidate"].(map[string]any)["result"].(map[string]any)["policy"]; p != "hpc-large" {
		t.Errorf("logged candidate policy %v, want hpc-large", p)
	}

	answer = "tuned-bandwidth"
	s.Compare(ctx, shadow.DecisionMigrationPolicies, objects, policy("hpc/fedora-gpu", "tuned-bandwidth", 4), decide)
	s.Wait()
	if got := s.Differences("hpc"); len(got) != 0 {
		t.Errorf("after the same decision, differences %+v, want none", got)
	}
	same := testutil.ToFloat64(comparisons(t, reg, "same"))
	if same != 1 {
		t.Errorf("same comparisons %v, want 1", same)
	}
}

func diffCounter(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	return metric(t, reg, "virtrules_candidate_decision_differences_total", map[string]string{"decision": "migrationPolicies"})
}

func comparisons(t *testing.T, reg *prometheus.Registry, result string) prometheus.Collector {
	t.Helper()
	return metric(t, reg, "virtrules_candidate_decision_comparisons_total", map[string]string{"decision": "migrationPolicies", "result": result})
}

// metric is one series of a registered counter, as a collector testutil can read.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := true
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					match = false
				}
			}
			if match {
				c := prometheus.NewCounter(prometheus.CounterOpts{Name: "copy"})
				c.Add(m.GetCounter().GetValue())
				return c
			}
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return nil
}

// A webhook's answer the candidate gives otherwise is counted under the webhook's decision
// and logged with both sides, but not kept for the reports; a candidate error is counted as
// such; with the queue full and no worker, an answer is not compared but counted as skipped.
func TestCompareAnswerCountsAndLogsWithoutKeeping(t *testing.T) {
	ctx := context.Background()
	active, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	logged := &decisions{}
	s, err := shadow.New(active, active, shadow.Options{Registerer: reg, DecisionLog: logged, MaxQueued: 1})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		Allowed    bool               `json:"allowed"`
		Violations []engine.Violation `json:"violations"`
	}
	policy := shadow.Object{Name: "db-again"}
	denied := answer{Violations: []engine.Violation{{Field: "spec.selectors", Message: `same selectors as MigrationPolicy "db"`}}}
	decision := shadow.DecisionMigrationPolicyValidation
	s.CompareAnswer(ctx, decision, policy, denied, func(context.Context) (any, error) { return answer{Allowed: true}, nil })
	// The queue holds one: this one is skipped, so the webhook never waits.
	s.CompareAnswer(ctx, decision, policy, denied, func(context.Context) (any, error) { return denied, nil })
	if n := testutil.ToFloat64(metric(t, reg, "virtrules_candidate_decision_comparisons_total", map[string]string{"decision": decision, "result": "skipped"})); n != 1 {
		t.Errorf("skipped %v, want 1", n)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Start(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	s.Wait()
	if n := testutil.ToFloat64(metric(t, reg, "virtrules_candidate_decision_differences_total", map[string]string{"decision": decision})); n != 1 {
		t.Errorf("differences %v, want 1", n)
	}
	if got := s.Differences(""); len(got) != 0 {
		t.Errorf("an admission answer kept for the reports: %+v", got)
	}
	if len(logged.all) != 1 || logged.all[0].Name != "candidate."+decision {
		t.Fatalf("decision log %+v: want one candidate.%s event", logged.all, decision)
	}
	result, err := ast.JSON(logged.all[0].Result.Value)
	if err != nil {
		t.Fatal(err)
	}
	sides := result.(map[string]any)
	if sides["object"] != "db-again" || sides["candidate"].(map[string]any)["result"].(map[string]any)["allowed"] != true ||
		sides["active"].(map[string]any)["result"].(map[string]any)["allowed"] != false {
		t.Errorf("logged %v: want db-again, allowed by the candidate, denied by the active bundle", sides)
	}
	if f := sides["fields"].([]any); len(f) != 2 || f[0] != "allowed" || f[1] != "violations" {
		t.Errorf("fields %v, want [allowed violations]", f)
	}

	s.CompareAnswer(ctx, decision, policy, denied, func(context.Context) (any, error) { return denied, nil })
	s.CompareAnswer(ctx, decision, policy, denied, func(context.Context) (any, error) { return nil, context.DeadlineExceeded })
	s.Wait()
	for result, want := range map[string]float64{"same": 1, "different": 1, "error": 1} {
		if n := testutil.ToFloat64(metric(t, reg, "virtrules_candidate_decision_comparisons_total", map[string]string{"decision": decision, "result": result})); n != want {
			t.Errorf("%s %v, want %v", result, n, want)
		}
	}
}
