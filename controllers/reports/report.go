package reports

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// What the results name: the decision (Policy) and, within it, what was decided (Rule), the
// same names eval -o json uses for the decisions.
const (
	// PolicyMigrationPolicy results count the VMIs that obey each MigrationPolicy (Rule: its
	// name, or RuleNoPolicy).
	PolicyMigrationPolicy = "migration-policy"
	// PolicyMigrationTarget results are the migrations whose added node-selector term left no
	// candidate or was refused (Rule: the reason code), and one result counting those that had
	// candidates (Rule: migrationtarget.ReasonCandidatesFound).
	PolicyMigrationTarget = "migration-target"
	// PolicyMigrationPolicyValidation results say whether each MigrationPolicy passes the
	// validation decision (Rule: its name).
	PolicyMigrationPolicyValidation = "migration-policy-validation"
	// PolicyNodeMigratability results count the nodes at each migratability level (Rule:
	// "level-N", or RuleNoLevel).
	PolicyNodeMigratability = "node-migratability"
	// PolicyCPUBaseline results are the CPU baseline of each group of nodes (Rule: the group,
	// or RuleAllNodes): pass with the model and features to pin, warn with the reason when no
	// CPU runs on every node of the group (eval's cpuBaseline).
	PolicyCPUBaseline = "cpu-baseline"
	// PolicyCandidateBundle results are the decisions a candidate bundle in shadow rollout
	// makes differently from the active one (Rule: the decision, as eval -o json names it).
	PolicyCandidateBundle = "candidate-bundle"

	// RuleNoPolicy is the Rule of the VMIs that obey no MigrationPolicy; not a valid object
	// name, so it cannot be mistaken for one.
	RuleNoPolicy = "<none>"
	// RuleNoLevel is the Rule of the nodes without a migratability level label.
	RuleNoLevel = "no-level"
	// RuleAllNodes is the Rule of the CPU baseline of every node (no group label).
	RuleAllNodes = "all-nodes"

	// CategoryMigration and CategoryNode group the results as report dashboards show them.
	CategoryMigration = "KubeVirt migration"
	CategoryNode      = "KubeVirt node"
	// CategoryShadow groups the candidate bundle's differences.
	CategoryShadow = "virt-rules shadow rollout"

	// maxMessage bounds one result's message (bytes); longer messages are cut at a rune.
	maxMessage = 1024
	// serverOverhead is what the API server adds to a stored report (uid, resourceVersion,
	// timestamps, managedFields), with room to spare, kept out of the results' budget.
	serverOverhead = 16 << 10
)

// The result values (openreports' enum).
const (
	resultPass  openreports.Result = "pass"
	resultFail  openreports.Result = "fail"
	resultWarn  openreports.Result = "warn"
	resultError openreports.Result = "error"
	resultSkip  openreports.Result = "skip"
)

// NamespaceFacts is what virt-rules' controllers wrote in one namespace.
type NamespaceFacts struct {
	Namespace string
	// VMIs counts the decided VMIs (those carrying the configuration annotation) by the
	// MigrationPolicy they obey ("" for none).
	VMIs map[string]int
	// Failed are the migrations the migrationtarget controller failed.
	Failed []FailedMigration
	// WithCandidates counts the migrations it found candidate nodes for.
	WithCandidates int
	// Differences are the decisions on objects of the namespace that a candidate bundle
	// makes differently (shadow rollout).
	Differences []shadow.Difference
}

// Empty tells whether there is nothing to report.
func (f NamespaceFacts) Empty() bool {
	return len(f.VMIs) == 0 && len(f.Failed) == 0 && f.WithCandidates == 0 && len(f.Differences) == 0
}

// FailedMigration is a migration with a False MigrationTargetAvailable condition.
type FailedMigration struct {
	Name, UID, VMI string
	// Reason is the condition's reason code (engine.Reason*), Message its message.
	Reason, Message string
	// Time is the condition's lastTransitionTime (zero when absent).
	Time time.Time
}

// ClusterFacts is what virt-rules' controllers wrote on cluster-scoped objects.
type ClusterFacts struct {
	Policies []PolicyValidity
	// Levels counts the nodes by their migratability level label ("" for none).
	Levels map[string]int
	// Differences are the decisions on cluster-scoped objects (nodes) that a candidate
	// bundle makes differently (shadow rollout).
	Differences []shadow.Difference
	// Baseline is the CPU baseline of the nodes, one entry per group; nil when not asked.
	Baseline []engine.CPUBaselineGroup
}

// PolicyValidity is what the migrationpolicy status controller wrote on one policy.
type PolicyValidity struct {
	Name, UID string
	// Valid is the valid annotation: "true", "false", or "" when not written yet.
	Valid string
	// Reason is the invalid-reason annotation of an invalid policy.
	Reason string
	// VMIs is the VMI-count annotation, as written ("" when absent).
	VMIs string
}

// NamespaceResults are the results of one namespace's report, in report order.
func NamespaceResults(f NamespaceFacts) []openreports.ReportResult {
	var out []openreports.ReportResult
	for policy, n := range f.VMIs {
		r := result(PolicyMigrationPolicy, CategoryMigration, policy, resultPass,
			fmt.Sprintf("%d VirtualMachineInstances obey MigrationPolicy %s", n, policy),
			map[string]string{"virtualMachineInstances": strconv.Itoa(n)})
		if policy == "" {
			r.Rule, r.Result = RuleNoPolicy, resultSkip
			r.Description = fmt.Sprintf("%d VirtualMachineInstances obey no MigrationPolicy: the KubeVirt CR's migration configuration applies", n)
		} else {
			r.Subjects = []corev1.ObjectReference{policyRef(policy, "")}
			r.Properties["migrationPolicy"] = policy
		}
		out = append(out, r)
	}
	for _, m := range f.Failed {
		r := result(PolicyMigrationTarget, CategoryMigration, m.Reason, resultFail, m.Message,
			map[string]string{"reason": m.Reason, "virtualMachineInstance": m.VMI})
		if refused(m.Reason) {
			r.Result = resultError
		}
		r.Subjects = []corev1.ObjectReference{{
			APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstanceMigration",
			Namespace: f.Namespace, Name: m.Name, UID: types.UID(m.UID),
		}}
		if !m.Time.IsZero() {
			r.Timestamp = metav1.Timestamp{Seconds: m.Time.Unix()}
		}
		out = append(out, r)
	}
	if f.WithCandidates > 0 {
		out = append(out, result(PolicyMigrationTarget, CategoryMigration, ReasonCandidatesFound, resultPass,
			fmt.Sprintf("%d migrations adding a node-selector term had candidate nodes", f.WithCandidates),
			map[string]string{"migrations": strconv.Itoa(f.WithCandidates)}))
	}
	out = append(out, differenceResults(f.Differences)...)
	sortResults(out)
	return out
}

// ReasonCandidatesFound is migrationtarget.ReasonCandidatesFound (not imported: this file is
// pure glue over what was written).
const ReasonCandidatesFound = "CandidatesFound"

// refused tells whether a reason code says the added term itself could not be evaluated (an
// error) rather than that it left no node (a failure).
func refused(reason string) bool {
	return reason == "InvalidTerm" || reason == "InvalidInput"
}

// ClusterResults are the results of the cluster report, in report order.
func ClusterResults(f ClusterFacts) []openreports.ReportResult {
	var out []openreports.ReportResult
	for _, p := range f.Policies {
		r := result(PolicyMigrationPolicyValidation, CategoryMigration, p.Name, resultPass,
			fmt.Sprintf("MigrationPolicy %s is valid", p.Name), map[string]string{"migrationPolicy": p.Name})
		switch p.Valid {
		case "true":
		case "false":
			r.Result, r.Description = resultFail, p.Reason
		default:
			r.Result, r.Description = resultSkip, fmt.Sprintf("MigrationPolicy %s is not validated yet", p.Name)
		}
		if p.VMIs != "" {
			r.Properties["virtualMachineInstances"] = p.VMIs
		}
		r.Subjects = []corev1.ObjectReference{policyRef(p.Name, p.UID)}
		out = append(out, r)
	}
	for level, n := range f.Levels {
		r := result(PolicyNodeMigratability, CategoryNode, "level-"+level, resultPass,
			fmt.Sprintf("%d nodes at host-model migratability level %s", n, level),
			map[string]string{"level": level, "nodes": strconv.Itoa(n)})
		if level == "" {
			r.Rule, r.Result = RuleNoLevel, resultSkip
			r.Description = fmt.Sprintf("%d nodes carry no host-model migratability level", n)
			delete(r.Properties, "level")
		}
		out = append(out, r)
	}
	out = append(out, baselineResults(f.Baseline)...)
	out = append(out, differenceResults(f.Differences)...)
	sortResults(out)
	return out
}

// baselineResults are one result per group of the CPU baseline: pass with the CPU to pin and
// what costs it most, warn with the reason when there is none.
func baselineResults(groups []engine.CPUBaselineGroup) []openreports.ReportResult {
	var out []openreports.ReportResult
	for _, g := range groups {
		rule := cmp.Or(g.Group, RuleAllNodes)
		props := map[string]string{"nodes": strconv.Itoa(len(g.Nodes)), "notConsidered": strconv.Itoa(len(g.NotConsidered))}
		if g.Model == nil {
			r := result(PolicyCPUBaseline, CategoryNode, rule, resultWarn, g.Message, props)
			r.Properties["reason"] = g.Reason
			out = append(out, r)
			continue
		}
		var require, disable []string
		for _, f := range g.Features {
			if f.Policy == "disable" {
				disable = append(disable, f.Name)
			} else {
				require = append(require, f.Name)
			}
		}
		props["model"], props["vendor"] = *g.Model, ptrOr(g.Vendor)
		props["requiredFeatures"], props["disabledFeatures"] = strings.Join(require, ","), strings.Join(disable, ",")
		msg := fmt.Sprintf("every one of the %d nodes runs CPU model %s with %d required and %d disabled features", len(g.Nodes), *g.Model, len(require), len(disable))
		if len(g.Tradeoffs) > 0 {
			t := g.Tradeoffs[0]
			msg += fmt.Sprintf("; without the %d node(s) of host model %s it would be %s with %d more features", len(t.Nodes), cmp.Or(t.HostModel, "none"), ptrOr(t.Model), len(t.GainedFeatures))
		}
		out = append(out, result(PolicyCPUBaseline, CategoryNode, rule, resultPass, msg, props))
	}
	return out
}

func ptrOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// subjectKinds are the kinds of the objects of each decision a candidate bundle is compared on.
var subjectKinds = map[string]corev1.ObjectReference{
	shadow.DecisionMigrationPolicies: {APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
	shadow.DecisionMigrationTargets:  {APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstanceMigration"},
	shadow.DecisionNodeMigratability: {APIVersion: "v1", Kind: "Node"},
	shadow.DecisionPools:             {APIVersion: "pool.virt-rules.io/v1alpha1", Kind: "VirtualMachinePool"},
}

// differenceResults are a warning per decision a candidate bundle makes differently, with
// both sides in the message (cut at maxMessage) and the revisions and fields as properties.
func differenceResults(diffs []shadow.Difference) []openreports.ReportResult {
	out := make([]openreports.ReportResult, 0, len(diffs))
	for _, d := range diffs {
		fields := strings.Join(d.Fields, ",")
		r := result(PolicyCandidateBundle, CategoryShadow, d.Decision, resultWarn,
			fmt.Sprintf("candidate bundle %s decides %s of %s differently (%s): candidate: %s; active bundle %s: %s",
				d.CandidateRevision, d.Decision, d.Object, fields, only(d.Candidate, d.Fields), d.ActiveRevision, only(d.Active, d.Fields)),
			map[string]string{"activeRevision": d.ActiveRevision, "candidateRevision": d.CandidateRevision, "fields": fields})
		ref := subjectKinds[d.Decision]
		ref.Namespace, ref.Name = d.Namespace, d.Name
		r.Subjects = []corev1.ObjectReference{ref}
		r.Timestamp = metav1.Timestamp{Seconds: d.Time.Unix()}
		out = append(out, r)
	}
	return out
}

// only is side (a JSON object) with only fields, so that a message, cut at maxMessage, shows
// what differs; side as it is when it is not an object.
func only(side json.RawMessage, fields []string) string {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(side, &all); err != nil || all == nil {
		return string(side)
	}
	kept := map[string]json.RawMessage{}
	for _, f := range fields {
		if v, ok := all[f]; ok {
			kept[f] = v
		}
	}
	data, _ := json.Marshal(kept) // raw JSON values always encode
	return string(data)
}

func result(policy, category, rule string, res openreports.Result, message string, props map[string]string) openreports.ReportResult {
	return openreports.ReportResult{
		Source: Source, Policy: policy, Category: category, Rule: rule, Result: res,
		Description: truncate(message, maxMessage), Properties: props,
	}
}

func policyRef(name, uid string) corev1.ObjectReference {
	return corev1.ObjectReference{APIVersion: "migrations.kubevirt.io/v1alpha1", Kind: "MigrationPolicy", Name: name, UID: types.UID(uid)}
}

// truncate cuts s to at most n bytes, at a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " …(truncated)"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// rank orders results most severe first, so a capped report keeps what needs attention.
func rank(r openreports.Result) int {
	switch r {
	case resultError:
		return 0
	case resultFail:
		return 1
	case resultWarn:
		return 2
	case resultPass:
		return 3
	default:
		return 4
	}
}

func sortResults(rs []openreports.ReportResult) {
	slices.SortFunc(rs, func(a, b openreports.ReportResult) int {
		return cmp.Or(
			cmp.Compare(rank(a.Result), rank(b.Result)),
			cmp.Compare(a.Policy, b.Policy),
			cmp.Compare(a.Rule, b.Rule),
			cmp.Compare(subjectName(a), subjectName(b)),
		)
	})
}

func subjectName(r openreports.ReportResult) string {
	if len(r.Subjects) == 0 {
		return ""
	}
	return r.Subjects[0].Name
}

// Summarize counts results by value.
func Summarize(rs []openreports.ReportResult) openreports.ReportSummary {
	var s openreports.ReportSummary
	for _, r := range rs {
		switch r.Result {
		case resultPass:
			s.Pass++
		case resultFail:
			s.Fail++
		case resultWarn:
			s.Warn++
		case resultError:
			s.Error++
		case resultSkip:
			s.Skip++
		}
	}
	return s
}

// Bound keeps the leading results (sorted most severe first) whose encoding fits in budget
// bytes and returns them with how many were left out.
func Bound(rs []openreports.ReportResult, budget int) (kept []openreports.ReportResult, omitted int, err error) {
	used := 2 // the brackets
	for i := range rs {
		data, err := json.Marshal(&rs[i])
		if err != nil {
			return nil, 0, fmt.Errorf("encode result %s/%s: %w", rs[i].Policy, rs[i].Rule, err)
		}
		if used+len(data)+1 > budget {
			return rs[:i], len(rs) - i, nil
		}
		used += len(data) + 1
	}
	return rs, 0, nil
}

// CarryTimestamps gives each result of next the timestamp of the same result in prev (same
// content but for the timestamp), and now to a new or changed result that has none of its
// own: a result's timestamp is when it was first found, and an unchanged report stays
// byte-for-byte the same.
func CarryTimestamps(prev, next []openreports.ReportResult, now time.Time) {
	seen := make(map[string]metav1.Timestamp, len(prev))
	for _, r := range prev {
		seen[contentKey(r)] = r.Timestamp
	}
	for i := range next {
		if next[i].Timestamp != (metav1.Timestamp{}) {
			continue
		}
		if ts, ok := seen[contentKey(next[i])]; ok {
			next[i].Timestamp = ts
		} else {
			next[i].Timestamp = metav1.Timestamp{Seconds: now.Unix()}
		}
	}
}

// contentKey is r's encoding without its timestamp.
func contentKey(r openreports.ReportResult) string {
	r.Timestamp = metav1.Timestamp{}
	data, _ := json.Marshal(&r) // a ReportResult always encodes
	return string(data)
}

// envelope is room for what a report holds besides its results (metadata, source, summary).
const envelope = 4 << 10

// Content is what a report holds, Report and ClusterReport alike.
type Content struct {
	Summary openreports.ReportSummary
	Results []openreports.ReportResult
	// Omitted counts the results left out to keep the report within its size.
	Omitted int
}

// Compose bounds all (in report order) to a report of at most maxBytes, stored: the summary
// counts every result, the results kept are the most severe that fit. Timestamps are carried
// over from prev (CarryTimestamps).
func Compose(all, prev []openreports.ReportResult, now time.Time, maxBytes int) (Content, error) {
	CarryTimestamps(prev, all, now)
	kept, omitted, err := Bound(all, maxBytes-serverOverhead-envelope)
	if err != nil {
		return Content{}, err
	}
	return Content{Summary: Summarize(all), Results: kept, Omitted: omitted}, nil
}
