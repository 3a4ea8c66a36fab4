package reports

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

func TestNamespaceResults(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	got := NamespaceResults(NamespaceFacts{
		Namespace: "prod",
		VMIs:      map[string]int{"gold": 3, "silver": 1, "": 2},
		Failed: []FailedMigration{
			{Name: "m-b", UID: "u2", VMI: "db", Reason: "NoCapacity", Message: "node-3 has no room", Time: at},
			{Name: "m-a", UID: "u1", VMI: "web", Reason: "InvalidTerm", Message: "matchFields[0].key: unknown"},
		},
		WithCandidates: 4,
	})
	type row struct {
		result, policy, rule, subject, message string
		props                                  map[string]string
	}
	var rows []row
	for _, r := range got {
		rows = append(rows, row{string(r.Result), r.Policy, r.Rule, subjectName(r), r.Description, r.Properties})
		if r.Source != Source {
			t.Errorf("result %s/%s: source %q, want %q", r.Policy, r.Rule, r.Source, Source)
		}
	}
	want := []row{
		{"error", PolicyMigrationTarget, "InvalidTerm", "m-a", "matchFields[0].key: unknown", map[string]string{"reason": "InvalidTerm", "virtualMachineInstance": "web"}},
		{"fail", PolicyMigrationTarget, "NoCapacity", "m-b", "node-3 has no room", map[string]string{"reason": "NoCapacity", "virtualMachineInstance": "db"}},
		{"pass", PolicyMigrationPolicy, "gold", "gold", "3 VirtualMachineInstances obey MigrationPolicy gold", map[string]string{"migrationPolicy": "gold", "virtualMachineInstances": "3"}},
		{"pass", PolicyMigrationPolicy, "silver", "silver", "1 VirtualMachineInstances obey MigrationPolicy silver", map[string]string{"migrationPolicy": "silver", "virtualMachineInstances": "1"}},
		{"pass", PolicyMigrationTarget, ReasonCandidatesFound, "", "4 migrations adding a node-selector term had candidate nodes", map[string]string{"migrations": "4"}},
		{"skip", PolicyMigrationPolicy, RuleNoPolicy, "", "2 VirtualMachineInstances obey no MigrationPolicy: the KubeVirt CR's migration configuration applies", map[string]string{"virtualMachineInstances": "2"}},
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("results:\n got %v\nwant %v", rows, want)
	}
	if got[1].Timestamp.Seconds != at.Unix() || got[1].Subjects[0].Namespace != "prod" || got[1].Subjects[0].UID != "u2" {
		t.Errorf("failed migration result: timestamp %v, subject %+v", got[1].Timestamp, got[1].Subjects[0])
	}
	if s := Summarize(got); s != (openreports.ReportSummary{Pass: 3, Fail: 1, Error: 1, Skip: 1}) {
		t.Errorf("summary %+v", s)
	}
}

func TestClusterResults(t *testing.T) {
	got := ClusterResults(ClusterFacts{
		Policies: []PolicyValidity{
			{Name: "ok", Valid: "true", VMIs: "5"},
			{Name: "bad", Valid: "false", Reason: "spec.bandwidthPerMigration: must not be negative", VMIs: "0"},
			{Name: "new"},
		},
		Levels: map[string]int{"100": 2, "50": 1, "": 3},
	})
	var rows []string
	for _, r := range got {
		rows = append(rows, fmt.Sprintf("%s %s %s: %s %v", r.Result, r.Policy, r.Rule, r.Description, r.Properties))
	}
	want := []string{
		"fail migration-policy-validation bad: spec.bandwidthPerMigration: must not be negative map[migrationPolicy:bad virtualMachineInstances:0]",
		"pass migration-policy-validation ok: MigrationPolicy ok is valid map[migrationPolicy:ok virtualMachineInstances:5]",
		"pass node-migratability level-100: 2 nodes at host-model migratability level 100 map[level:100 nodes:2]",
		"pass node-migratability level-50: 1 nodes at host-model migratability level 50 map[level:50 nodes:1]",
		"skip migration-policy-validation new: MigrationPolicy new is not validated yet map[migrationPolicy:new]",
		"skip node-migratability no-level: 3 nodes carry no host-model migratability level map[nodes:3]",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("results:\n got %s\nwant %s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
}

// failures are n failed migrations with messages of size bytes.
func failures(n, size int) NamespaceFacts {
	f := NamespaceFacts{Namespace: "ns", VMIs: map[string]int{"gold": 7}}
	for i := range n {
		f.Failed = append(f.Failed, FailedMigration{Name: fmt.Sprintf("m-%05d", i), VMI: "v", Reason: "NoMatchingNode", Message: strings.Repeat("x", size)})
	}
	return f
}

func TestComposeBoundsTheReport(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	all := NamespaceResults(failures(3000, 2000))
	c, err := Compose(all, nil, now, MaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	if c.Summary != (openreports.ReportSummary{Fail: 3000, Pass: 1}) {
		t.Errorf("summary %+v: it must count every result, kept or not", c.Summary)
	}
	if c.Omitted == 0 || c.Omitted+len(c.Results) != len(all) {
		t.Fatalf("kept %d, omitted %d of %d", len(c.Results), c.Omitted, len(all))
	}
	report := openreports.Report{ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: "ns"}, Source: Source, Summary: c.Summary, Results: c.Results}
	data, err := json.Marshal(&report)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > MaxBytes-serverOverhead {
		t.Errorf("report of %d bytes, over %d", len(data), MaxBytes-serverOverhead)
	}
	if len(data) < MaxBytes/2 {
		t.Errorf("report of %d bytes: the budget is not used", len(data))
	}
	for _, r := range c.Results {
		if len(r.Description) > maxMessage {
			t.Fatalf("message of %d bytes, over %d", len(r.Description), maxMessage)
		}
		if r.Result != resultFail {
			t.Fatalf("kept %s/%s (%s) before all failures", r.Policy, r.Rule, r.Result)
		}
	}

	small, err := Compose(NamespaceResults(failures(3, 10)), nil, now, MaxBytes)
	if err != nil || small.Omitted != 0 || len(small.Results) != 4 {
		t.Errorf("a small report: %d results, %d omitted, %v", len(small.Results), small.Omitted, err)
	}
}

func TestCarryTimestamps(t *testing.T) {
	first := time.Unix(1_800_000_000, 0)
	prev := NamespaceResults(NamespaceFacts{VMIs: map[string]int{"gold": 1, "silver": 2}})
	CarryTimestamps(nil, prev, first)
	next := NamespaceResults(NamespaceFacts{VMIs: map[string]int{"gold": 1, "silver": 3}})
	CarryTimestamps(prev, next, first.Add(time.Hour))
	if next[0].Rule != "gold" || next[0].Timestamp.Seconds != first.Unix() {
		t.Errorf("unchanged result %s: timestamp %d, want the first %d", next[0].Rule, next[0].Timestamp.Seconds, first.Unix())
	}
	if next[1].Rule != "silver" || next[1].Timestamp.Seconds != first.Add(time.Hour).Unix() {
		t.Errorf("changed result %s: timestamp %d, want now", next[1].Rule, next[1].Timestamp.Seconds)
	}
}

func TestTruncate(t *testing.T) {
	s := strings.Repeat("é", 1000) // 2000 bytes
	got := truncate(s, maxMessage)
	if len(got) > maxMessage || !strings.HasSuffix(got, "(truncated)") || !strings.HasPrefix(got, "éé") {
		t.Errorf("truncate: %d bytes, %q...", len(got), got[len(got)-20:])
	}
	if truncate("short", maxMessage) != "short" {
		t.Error("a short message must stay as it is")
	}
}

func TestAvailable(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	if ok, err := Available(mapper); ok || err != nil {
		t.Errorf("without the kinds: %v, %v; want false, nil", ok, err)
	}
	mapper.Add(GVKReport, meta.RESTScopeNamespace)
	if ok, err := Available(mapper); ok || err != nil {
		t.Errorf("without ClusterReport: %v, %v; want false, nil", ok, err)
	}
	mapper.Add(GVKClusterReport, meta.RESTScopeRoot)
	if ok, err := Available(mapper); !ok || err != nil {
		t.Errorf("with both: %v, %v; want true, nil", ok, err)
	}
}

// A candidate bundle's differences are warnings naming the object by its kind, with both
// sides in the message and the revisions and fields as properties; nodes' go to the cluster
// report.
func TestCandidateDifferenceResults(t *testing.T) {
	at := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	ns := NamespaceResults(NamespaceFacts{Namespace: "hpc", Differences: []shadow.Difference{{
		Decision: shadow.DecisionMigrationPolicies, Namespace: "hpc", Name: "fedora-gpu", Object: "hpc/fedora-gpu",
		Fields: []string{"configuration", "policy"}, Active: json.RawMessage(`{"policy":"tuned-bandwidth"}`),
		Candidate: json.RawMessage(`{"policy":"hpc-large","vmi":"hpc/fedora-gpu"}`), ActiveRevision: "a1", CandidateRevision: "c1", Time: at,
	}}})
	if len(ns) != 1 {
		t.Fatalf("results %+v, want one", ns)
	}
	r := ns[0]
	if r.Policy != PolicyCandidateBundle || r.Rule != "migrationPolicies" || r.Result != resultWarn || r.Category != CategoryShadow {
		t.Errorf("result %s/%s %s %s: want %s/migrationPolicies warn %s", r.Policy, r.Rule, r.Result, r.Category, PolicyCandidateBundle, CategoryShadow)
	}
	if len(r.Subjects) != 1 || r.Subjects[0].Kind != "VirtualMachineInstance" || r.Subjects[0].Namespace != "hpc" || r.Subjects[0].Name != "fedora-gpu" {
		t.Errorf("subjects %+v: want VirtualMachineInstance hpc/fedora-gpu", r.Subjects)
	}
	want := `candidate bundle c1 decides migrationPolicies of hpc/fedora-gpu differently (configuration,policy): candidate: {"policy":"hpc-large"}; active bundle a1: {"policy":"tuned-bandwidth"}`
	if r.Description != want {
		t.Errorf("message %q, want %q", r.Description, want)
	}
	if r.Properties["fields"] != "configuration,policy" || r.Properties["activeRevision"] != "a1" || r.Properties["candidateRevision"] != "c1" {
		t.Errorf("properties %v", r.Properties)
	}
	if r.Timestamp.Seconds != at.Unix() {
		t.Errorf("timestamp %v, want %v", r.Timestamp, at)
	}
	cluster := ClusterResults(ClusterFacts{Differences: []shadow.Difference{{
		Decision: shadow.DecisionNodeMigratability, Name: "node-1", Object: "node-1", Fields: []string{"level"},
		Active: json.RawMessage(`{"level":50}`), Candidate: json.RawMessage(`{"level":100}`), Time: at,
	}}})
	if len(cluster) != 1 || cluster[0].Subjects[0].Kind != "Node" || cluster[0].Subjects[0].Name != "node-1" {
		t.Errorf("cluster results %+v: want one naming Node node-1", cluster)
	}
	if (NamespaceFacts{Differences: []shadow.Difference{{}}}).Empty() {
		t.Error("a namespace with only a difference is empty, want a report")
	}
}

func TestBaselineResults(t *testing.T) {
	str := func(s string) *string { return &s }
	got := ClusterResults(ClusterFacts{Baseline: []engine.CPUBaselineGroup{
		{
			Group: "", Nodes: []string{"a", "b", "c"}, Vendor: str("Intel"), Model: str("Skylake-Server-IBRS"),
			Features:  []engine.CPUFeature{{Name: "pku", Policy: "require"}, {Name: "hle", Policy: "disable"}},
			Tradeoffs: []engine.CPUBaselineTradeoff{{Nodes: []string{"c"}, HostModel: "Skylake-Server-IBRS", Model: str("Icelake-Server"), GainedFeatures: []string{"gfni", "vaes"}}},
		},
		{Group: "zone=b", Nodes: []string{"d", "e"}, NotConsidered: []engine.CPUBaselineNode{{Node: "f", Reason: "NoCPULabels"}}, Reason: "VendorsDiffer", Message: "the nodes are of 2 vendors"},
	}})
	if len(got) != 2 {
		t.Fatalf("got %d results, want 2: %+v", len(got), got)
	}
	byRule := map[string]openreports.ReportResult{}
	for _, r := range got {
		if r.Policy != PolicyCPUBaseline {
			t.Errorf("result %s/%s: want policy %s", r.Policy, r.Rule, PolicyCPUBaseline)
		}
		byRule[r.Rule] = r
	}
	all, zone := byRule[RuleAllNodes], byRule["zone=b"]
	if all.Result != resultPass || all.Properties["model"] != "Skylake-Server-IBRS" || all.Properties["requiredFeatures"] != "pku" || all.Properties["disabledFeatures"] != "hle" {
		t.Errorf("all nodes: %+v", all)
	}
	if want := "every one of the 3 nodes runs CPU model Skylake-Server-IBRS with 1 required and 1 disabled features; without the 1 node(s) of host model Skylake-Server-IBRS it would be Icelake-Server with 2 more features"; all.Description != want {
		t.Errorf("all nodes: description %q, want %q", all.Description, want)
	}
	if zone.Result != resultWarn || zone.Properties["reason"] != "VendorsDiffer" || zone.Properties["notConsidered"] != "1" || zone.Description != "the nodes are of 2 vendors" {
		t.Errorf("zone=b: %+v", zone)
	}
}
