// Package eval decides offline, over plain manifests, what the virt-rules controllers would
// decide in a cluster. It calls the same engine methods as the controllers, so offline and
// in-cluster answers cannot drift; formatting is left to the CLI.
package eval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	migrationsv1alpha1 "kubevirt.io/api/migrations/v1alpha1"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/internal/nodetrim"
)

// The kinds the decisions read, by group and kind (any version).
var (
	kindVMI             = schema.GroupKind{Group: "kubevirt.io", Kind: "VirtualMachineInstance"}
	kindKubeVirt        = schema.GroupKind{Group: "kubevirt.io", Kind: "KubeVirt"}
	kindNamespace       = schema.GroupKind{Group: "", Kind: "Namespace"}
	kindMigrationPolicy = schema.GroupKind{Group: "migrations.kubevirt.io", Kind: "MigrationPolicy"}
	kindMigration       = schema.GroupKind{Group: "kubevirt.io", Kind: "VirtualMachineInstanceMigration"}
	kindNode            = schema.GroupKind{Group: "", Kind: "Node"}
	kindPod             = schema.GroupKind{Group: "", Kind: "Pod"}
	// KubeVirt's own pools, and the ControllerRevisions its pool controller keeps of their
	// VM templates (kubevirtpool.go).
	kindKubeVirtPool       = schema.GroupKind{Group: "pool.kubevirt.io", Kind: "VirtualMachinePool"}
	kindControllerRevision = schema.GroupKind{Group: "apps", Kind: "ControllerRevision"}
)

// Options tune Run.
type Options struct {
	// Explain adds to every decision why each candidate won or lost.
	Explain bool
	// Warn receives one line per input that was ignored or assumed; nil drops them.
	Warn func(line string)
	// Now is the time plans are made for (pool autohealing backoff); zero is time.Now().
	Now time.Time
	// Candidates adds, for every VMI on a node that no migration among the inputs is moving,
	// the nodes it could migrate to now and every other node's first reason (migrationCandidates).
	Candidates bool
	// Drift adds where what the objects store (annotations, status, labels written by the
	// controllers and KubeVirt) differs from the decisions (drift).
	Drift bool
	// Drain and DrainSelector name nodes to drain (by name; by label selector): the report
	// gets drain, what draining them does to every VMI on them. A name not among the nodes,
	// or a selector matching none, is an ErrDrainNodes.
	Drain         []string
	DrainSelector string
	// CPUBaseline adds cpuBaseline: for the schedulable nodes, or each group of them by the
	// value of the node label CPUBaselineGroupBy (which implies it; "" leaves the grouping to
	// the bundle's settings), the guest CPU every node runs and what each kind of node costs.
	CPUBaseline        bool
	CPUBaselineGroupBy string
	// Observe, when set, receives the time each evaluation of a decision took, by the name of
	// the report's section (migrationPolicies, migrationPolicyValidation, ...).
	Observe func(decision string, took time.Duration)
}

// observe times one evaluation of decision for opts.Observe.
func (o Options) observe(decision string) func() {
	if o.Observe == nil {
		return func() {}
	}
	start := time.Now()
	return func() { o.Observe(decision, time.Since(start)) }
}

// Report is every decision, each list sorted by its object key.
type Report struct {
	MigrationPolicies  []MigrationPolicyResult    `json:"migrationPolicies"`
	MigrationTargets   []MigrationTargetResult    `json:"migrationTargets"`
	NodeMigratability  []NodeMigratabilityResult  `json:"nodeMigratability"`
	SchedulingAffinity []SchedulingAffinityResult `json:"schedulingAffinity"`
	// Pools are the VirtualMachinePool plans; absent when no pool is among the inputs.
	Pools []PoolResult `json:"pools,omitempty"`
	// MigrationCandidates are, with Options.Candidates, where each VMI not migrating could go.
	MigrationCandidates []MigrationCandidatesResult `json:"migrationCandidates,omitempty"`
	// Drain is, with Options.Drain or DrainSelector, what draining those nodes does.
	Drain *DrainResult `json:"drain,omitempty"`
	// CPUBaseline is, with Options.CPUBaseline, the guest CPU every node of each group runs.
	CPUBaseline []CPUBaselineResult `json:"cpuBaseline,omitzero"`
	// Drift is, with Options.Drift, every stored value that differs from its decision.
	Drift []DriftResult `json:"drift,omitempty"`
	// Errors are the objects that could not be decided, each located and named: invalid by
	// the rules' validation or KubeVirt's types, inconsistent (a pending migration of an
	// absent VMI), unreadable, or failed by the rules. Sorted by location. Every other object
	// is decided all the same.
	Errors []*manifest.Error `json:"errors"`
}

// AddErrors adds errs (such as those of reading the inputs) to the report's, sorted.
func (r *Report) AddErrors(errs ...*manifest.Error) {
	r.Errors = append(r.Errors, errs...)
	manifest.SortErrors(r.Errors)
}

// MigrationPolicyResult is the MigrationPolicy decision for one VMI.
type MigrationPolicyResult struct {
	VMI string `json:"vmi"`
	// Phase is the VMI's phase when KubeVirt is done with it (Succeeded or Failed): it will
	// never migrate, but the controller keeps its policy annotations, so it is decided.
	Phase          string                              `json:"phase,omitempty"`
	Policy         *string                             `json:"policy"`
	MatchingLabels int                                 `json:"matchingLabels"`
	Configuration  kubevirtv1.VMIMConfigurationOptions `json:"configuration"`
	Explanation    *engine.MigrationPolicyExplanation  `json:"explanation,omitempty"`
}

// MigrationTargetResult is where one VirtualMachineInstanceMigration may take its VMI.
type MigrationTargetResult struct {
	Migration string `json:"migration"`
	VMI       string `json:"vmi"`
	// Phase is the migration's status.phase. A migration in a final phase (Succeeded,
	// Failed) is history: reported with its phase and no target decision, and its VMI need
	// not be among the inputs (KubeVirt deletes a deleted VMI's migrations, but a dump taken
	// before virt-controller does, or restored from an archive, still holds them).
	Phase              string                             `json:"phase,omitempty"`
	CandidateNodes     []string                           `json:"candidateNodes"`
	TargetNodeAffinity *corev1.NodeAffinity               `json:"targetNodeAffinity"`
	Error              *engine.MigrationTargetError       `json:"error"`
	Explanation        *engine.MigrationTargetExplanation `json:"explanation,omitempty"`
}

// NodeMigratabilityResult is the host-model migratability level of one node.
type NodeMigratabilityResult struct {
	Node  string `json:"node"`
	Level int    `json:"level"`
}

// SchedulingAffinityResult is the node affinity a not yet scheduled VMI's launcher pod gets.
type SchedulingAffinityResult struct {
	VMI          string               `json:"vmi"`
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity"`
}

// inputs are the objects sorted by what reads them.
type inputs struct {
	vmis       []manifest.Object
	namespaces map[string]manifest.Object
	policies   []manifest.Object
	kubevirt   *manifest.Object
	migrations []manifest.Object
	nodes      []manifest.Object
	pods       []manifest.Object

	poolObjs    []manifest.Object
	vms         []manifest.Object
	dataVolumes []manifest.Object

	// kubevirtPools are pool.kubevirt.io pools; revisions, the ControllerRevisions of the
	// inputs (those of KubeVirt's pools are read, the others ignored).
	kubevirtPools []manifest.Object
	revisions     []manifest.Object

	// errs are the objects in error so far; failed, the keys (objectKey) of those not to
	// decide.
	errs   []*manifest.Error
	failed map[string]bool
}

// objectKey is "group/Kind namespace/name", one object of the inputs.
func objectKey(o manifest.Object) string {
	return o.GroupVersionKind().GroupKind().String() + " " + o.GetNamespace() + "/" + o.GetName()
}

// fail records err (an error or several, about o) as o's entries in the report's errors, and
// o as not to be decided. A *manifest.Error is kept as it is; an engine.FieldError is
// located at its field of o; anything else is the rules failing on o.
func (in *inputs) fail(o manifest.Object, err error) {
	in.failed[objectKey(o)] = true
	located, rest := manifest.Errors(err)
	in.errs = append(in.errs, located...)
	if rest == nil {
		return
	}
	if fields := fieldErrors(rest); len(fields) > 0 {
		for _, f := range fields {
			in.errs = append(in.errs, o.Error(manifest.ReasonInvalid, f.Field, "%s", f.Message))
		}
		return
	}
	in.errs = append(in.errs, o.Error(manifest.ReasonDecisionFailed, "", "%v", rest))
}

// decideError is what a decision's error about o means for the run: nil when it is o's alone
// (recorded in the report's errors), or the error that ends the run (the context ended).
func (in *inputs) decideError(ctx context.Context, o manifest.Object, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", o.Describe(), err)
	}
	in.fail(o, err)
	return nil
}

// decided is whether o is to be decided: none of its own errors, so far.
func (in *inputs) decided(o manifest.Object) bool { return !in.failed[objectKey(o)] }

// kubevirtCR is the KubeVirt CR the decisions read: nil when there is none, or when it is in
// error (its errors say the decisions were made without it).
func (in *inputs) kubevirtCR() *unstructured.Unstructured {
	if in.kubevirt == nil || !in.decided(*in.kubevirt) {
		return nil
	}
	return in.kubevirt.Unstructured
}

// Run decides for objs. An object that cannot be decided (malformed, invalid by the rules'
// validation, inconsistent, or failed by the rules) is an entry of the report's Errors, named
// and located; every other object is decided all the same. The error is for a run that could
// not happen at all (the context ended, the rules cannot prepare the objects together).
func Run(ctx context.Context, eng *engine.Engine, objs []manifest.Object, opts Options) (*Report, error) {
	warn := opts.Warn
	if warn == nil {
		warn = func(string) {}
	}
	in := sortInputs(objs, warn)
	warnDesignFields(objs, warn)
	if err := in.validate(ctx, eng, opts); err != nil {
		return nil, err
	}
	report := &Report{}
	var err error
	if report.MigrationPolicies, err = in.migrationPolicies(ctx, eng, opts, warn); err != nil {
		return nil, err
	}
	done := opts.observe("nodeMigratability")
	nodes := eng.NewNodes()
	for _, o := range in.nodes {
		if !in.decided(o) {
			continue
		}
		if err := nodes.Upsert(o.Unstructured); err != nil {
			if err := in.decideError(ctx, o, err); err != nil {
				return nil, err
			}
		}
	}
	if report.NodeMigratability, err = nodeMigratability(ctx, nodes); err != nil {
		return nil, err
	}
	done()
	if opts.CPUBaseline || opts.CPUBaselineGroupBy != "" {
		done := opts.observe("cpuBaseline")
		if report.CPUBaseline, err = cpuBaseline(ctx, nodes, report.NodeMigratability, opts, warn); err != nil {
			return nil, err
		}
		done()
	}
	if report.MigrationTargets, err = in.migrationTargets(ctx, eng, nodes, opts); err != nil {
		return nil, err
	}
	if report.SchedulingAffinity, err = in.schedulingAffinity(ctx, eng, opts); err != nil {
		return nil, err
	}
	if opts.Candidates {
		if report.MigrationCandidates, err = in.migrationCandidates(ctx, eng, nodes, opts); err != nil {
			return nil, err
		}
	}
	if len(opts.Drain) > 0 || opts.DrainSelector != "" {
		if report.Drain, err = in.drain(ctx, eng, nodes, report.MigrationPolicies, opts, warn); err != nil {
			return nil, err
		}
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	if report.Pools, err = in.pools(ctx, eng, now, opts, warn); err != nil {
		return nil, err
	}
	previews, err := in.kubevirtPoolPreviews(ctx, eng, now, opts, warn)
	if err != nil {
		return nil, err
	}
	report.Pools = append(report.Pools, previews...)
	sortPools(report.Pools)
	if opts.Drift {
		report.Drift = in.drift(report)
	}
	report.Errors = []*manifest.Error{}
	report.AddErrors(in.errs...)
	return report, nil
}

// finished is whether KubeVirt is done with o, a VMI or a migration: its status.phase is
// Succeeded or Failed.
func finished(o manifest.Object) (string, bool) {
	phase, _, _ := unstructured.NestedString(o.Object, "status", "phase")
	return phase, phase == "Succeeded" || phase == "Failed"
}

// namespacedKinds are the namespaced kinds eval reads.
var namespacedKinds = map[schema.GroupKind]bool{
	kindVMI: true, kindMigration: true, kindPod: true, kindPool: true, kindVirtualMachine: true, kindDataVolume: true,
	kindKubeVirtPool: true, kindControllerRevision: true,
}

func sortInputs(objs []manifest.Object, warn func(string)) *inputs {
	in := &inputs{namespaces: map[string]manifest.Object{}, failed: map[string]bool{}}
	seen := map[string]manifest.Object{}
	ignored := map[string][]manifest.Object{}
	for _, o := range objs {
		gk := o.GroupVersionKind().GroupKind()
		// Namespaced kinds without a namespace are in "default", as kubectl puts them: before
		// the duplicate check, so that v1 and default/v1 are one object, said twice.
		if namespacedKinds[gk] && o.GetNamespace() == "" {
			o.SetNamespace("default")
		}
		key := objectKey(o)
		if first, dup := seen[key]; dup {
			in.errs = append(in.errs, o.Error(manifest.ReasonDuplicate, "metadata.name", "also defined at %s: this one is not decided", first.Position()))
			continue
		}
		seen[key] = o
		switch gk {
		case kindVMI:
			in.vmis = append(in.vmis, o)
		case kindNamespace:
			in.namespaces[o.GetName()] = o
		case kindMigrationPolicy:
			in.policies = append(in.policies, o)
		case kindMigration:
			in.migrations = append(in.migrations, o)
		case kindNode:
			if err := checkLabels(o); err != nil {
				in.fail(o, err)
				continue
			}
			o.Unstructured = trimNode(o.Unstructured)
			in.nodes = append(in.nodes, o)
		case kindPod:
			// A terminated pod holds nothing of its node (eval --kubeconfig does not list them).
			if phase, _, _ := unstructured.NestedString(o.Object, "status", "phase"); phase == "Succeeded" || phase == "Failed" {
				continue
			}
			in.pods = append(in.pods, o)
		case kindPool:
			in.poolObjs = append(in.poolObjs, o)
		case kindVirtualMachine:
			in.vms = append(in.vms, o)
		case kindDataVolume:
			in.dataVolumes = append(in.dataVolumes, o)
		case kindKubeVirtPool:
			in.kubevirtPools = append(in.kubevirtPools, o)
		case kindControllerRevision:
			// KubeVirt's pool controller's; other controllers' (DaemonSets, StatefulSets)
			// are no decision's.
			if !kubevirtPoolRevision(o) {
				kind := o.GetAPIVersion() + " " + o.GetKind()
				ignored[kind] = append(ignored[kind], o)
				continue
			}
			in.revisions = append(in.revisions, o)
		case kindKubeVirt:
			if in.kubevirt != nil {
				in.errs = append(in.errs, o.Error(manifest.ReasonDuplicate, "", "a second KubeVirt CR (the first is at %s; a cluster has one): this one is not read", in.kubevirt.Position()))
				continue
			}
			in.kubevirt = &o
		default:
			kind := o.GetAPIVersion() + " " + o.GetKind()
			ignored[kind] = append(ignored[kind], o)
		}
	}
	for _, kind := range sortedKeys(ignored) {
		objs := ignored[kind]
		if len(objs) == 1 {
			warn(fmt.Sprintf("%s: ignoring %s %s: no decision reads it", objs[0].Position(), objs[0].GetAPIVersion(), objs[0].Describe()))
			continue
		}
		warn(fmt.Sprintf("%s: ignoring %d %s objects (this one first): no decision reads them", objs[0].Position(), len(objs), kind))
	}
	return in
}

// validate checks the objects the decisions read, recording every object in error: a VMI
// or Namespace with labels no cluster stores, a KubeVirt CR that KubeVirt's types refuse, a
// MigrationPolicy the rules' validation refuses. Such a policy stays in the policy set, as it
// does in the cluster, where the rules make it match nothing.
func (in *inputs) validate(ctx context.Context, eng *engine.Engine, opts Options) error {
	for _, o := range in.vmis {
		if err := checkLabels(o); err != nil {
			in.fail(o, err)
		}
	}
	for _, name := range sortedKeys(in.namespaces) {
		if err := checkLabels(in.namespaces[name]); err != nil {
			in.fail(in.namespaces[name], err)
		}
	}
	if in.kubevirt != nil {
		if err := checkMigrationConfiguration(*in.kubevirt); err != nil {
			in.fail(*in.kubevirt, errors.Join(err, in.kubevirt.Error(manifest.ReasonInvalid, "", "decided as if there were no KubeVirt CR")))
		}
	}
	// A policy KubeVirt's own type cannot read (bandwidthPerMigration: lots) is one no cluster
	// stores (KubeVirt's CRD refuses it): it is in error and out of the policy set, so that the
	// VMIs are decided as in a cluster, without it.
	kept := in.policies[:0]
	for _, o := range in.policies {
		if field, msg := checkPolicyType(o); field != "" {
			in.fail(o, o.Error(manifest.ReasonInvalid, field, "%s (KubeVirt's MigrationPolicy type refuses it: no cluster stores this policy, and the VMIs are decided without it)", msg))
			continue
		}
		kept = append(kept, o)
	}
	in.policies = kept
	// Every policy against the same prepared set: each policy's own entry in it has its name,
	// so the validation takes it for its old version and ignores it. Each is checked as a
	// create, in the cluster of the KubeVirt CR given (its feature gates), if any.
	existing := eng.ExistingMigrationPolicies(unstructuredOf(in.policies))
	kubevirt := in.kubevirtCR()
	for _, o := range in.policies {
		done := opts.observe("migrationPolicyValidation")
		violations, err := eng.ValidateMigrationPolicyAdmission(ctx, engine.MigrationPolicyAdmission{Policy: o.Unstructured, KubeVirt: kubevirt}, existing)
		done()
		if err != nil {
			if err := in.decideError(ctx, o, err); err != nil {
				return err
			}
			continue
		}
		for _, v := range violations {
			in.errs = append(in.errs, o.Error(manifest.ReasonInvalid, v.Field, "%s", v.Message))
		}
	}
	return nil
}

// checkPolicyType reads o's spec into KubeVirt's MigrationPolicy type, as the API server's
// schema and KubeVirt's clients do: a field of the wrong type or a quantity that is none is
// an error at that field ("" when the type reads it all).
func checkPolicyType(o manifest.Object) (field, msg string) {
	raw, found := o.Object["spec"]
	if !found || raw == nil {
		return "", ""
	}
	spec, ok := raw.(map[string]any)
	if !ok {
		return "spec", "want an object, got " + manifest.TypeName(raw)
	}
	// Field by field, so that the error names the field at fault (a quantity's own error
	// does not). The selectors are the rules' to read: they take the designs' shapes too
	// (warnDesignFields says a cluster refuses those).
	for _, field := range sortedKeys(spec) {
		if field == "selectors" {
			continue
		}
		data, err := json.Marshal(map[string]any{field: spec[field]})
		if err != nil {
			return "spec." + field, err.Error()
		}
		var typed migrationsv1alpha1.MigrationPolicySpec
		if err := json.Unmarshal(data, &typed); err != nil {
			if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
				return "spec." + te.Field, fmt.Sprintf("want %s, got a %s", te.Type, te.Value)
			}
			if s, ok := spec[field].(string); ok && errors.Is(err, resource.ErrFormatWrong) {
				return "spec." + field, fmt.Sprintf("%s is not a quantity such as 64Mi, 1Gi, 100M or 1e9", shown(s))
			}
			if s, ok := spec[field].(string); ok {
				return "spec." + field, fmt.Sprintf("%s: %v", shown(s), err)
			}
			return "spec." + field, err.Error()
		}
	}
	return "", ""
}

func checkLabels(o manifest.Object) error {
	raw, found, _ := unstructured.NestedFieldNoCopy(o.Object, "metadata", "labels")
	if !found || raw == nil {
		return nil
	}
	labels, ok := raw.(map[string]any)
	if !ok {
		return o.Errorf("metadata.labels", "want a map of label key to string value, got %s", manifest.TypeName(raw))
	}
	var errs []error
	for _, k := range sortedKeys(labels) {
		v, ok := labels[k].(string)
		if !ok {
			errs = append(errs, o.Errorf("metadata.labels."+k, "label values must be strings, got %s (quote it in YAML)", manifest.TypeName(labels[k])))
			continue
		}
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, o.Errorf("metadata.labels."+k, "invalid label key: %s", msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, o.Errorf("metadata.labels."+k, "invalid label value %s: %s", shown(v), msg))
		}
	}
	return errors.Join(errs...)
}

// checkMigrationConfiguration type-checks the KubeVirt CR's spec (spec.configuration.migrations
// above all) against KubeVirt's own Go type; unknown fields are kept for the rules.
func checkMigrationConfiguration(o manifest.Object) error {
	raw, found := o.Object["spec"]
	if !found || raw == nil {
		return nil
	}
	if _, ok := raw.(map[string]any); !ok {
		return o.Errorf("spec", "want an object, got %s", manifest.TypeName(raw))
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return o.Errorf("spec", "%v", err)
	}
	var spec kubevirtv1.KubeVirtSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
			return o.Errorf("spec."+te.Field, "want %s, got a %s", te.Type, te.Value)
		}
		return o.Errorf("spec", "%v", err)
	}
	bandwidth, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "configuration", "migrations", "bandwidthPerMigration")
	if msg := engine.Int64QuantityProblem(bandwidth); msg != "" {
		return o.Errorf("spec.configuration.migrations.bandwidthPerMigration", "%s", msg)
	}
	return nil
}

func (in *inputs) migrationPolicies(ctx context.Context, eng *engine.Engine, opts Options, warn func(string)) ([]MigrationPolicyResult, error) {
	set, err := eng.MigrationPolicies(unstructuredOf(in.policies), in.kubevirtCR())
	if err != nil {
		return nil, err
	}
	if opts.Observe != nil && len(in.vmis) > 0 {
		// The set prepares its index (and the partial evaluation) on first use, once per policy
		// set and bundle, as the controller does once per policy change: timed on its own, so
		// migrationPolicies times the per-VMI decision alone.
		done := opts.observe("migrationPolicyIndex")
		_, err := set.Malformed(ctx)
		done()
		if err != nil {
			return nil, err
		}
	}
	missing := map[string]int{}
	results := make([]MigrationPolicyResult, 0, len(in.vmis))
	for _, o := range in.vmis {
		if !in.decided(o) {
			continue
		}
		subject := engine.MigrationPolicySubject{Namespace: o.GetNamespace(), Name: o.GetName(), Labels: o.GetLabels()}
		if ns, ok := in.namespaces[subject.Namespace]; ok {
			if !in.decided(ns) {
				in.fail(o, o.Error(manifest.ReasonInconsistent, "metadata.namespace", "its Namespace %s is in error: not decided", subject.Namespace))
				continue
			}
			subject.NamespaceLabels = ns.GetLabels()
			if subject.NamespaceLabels == nil {
				subject.NamespaceLabels = map[string]string{}
			}
		} else {
			missing[subject.Namespace]++
		}
		done := opts.observe("migrationPolicies")
		d, err := set.Decide(ctx, subject)
		done()
		if err != nil {
			if err := in.decideError(ctx, o, err); err != nil {
				return nil, err
			}
			continue
		}
		r := MigrationPolicyResultOf(subject.Key(), d)
		if phase, done := finished(o); done {
			r.Phase = phase
		}
		if opts.Explain {
			if r.Explanation, err = set.Explain(ctx, subject); err != nil {
				if err := in.decideError(ctx, o, err); err != nil {
					return nil, err
				}
				continue
			}
		}
		results = append(results, r)
	}
	for _, ns := range sortedKeys(missing) {
		warn(fmt.Sprintf("Namespace %s is not among the inputs: its %d VirtualMachineInstance(s) are treated as in an unlabelled namespace", ns, missing[ns]))
	}
	slices.SortFunc(results, func(a, b MigrationPolicyResult) int { return strings.Compare(a.VMI, b.VMI) })
	return results, nil
}

func unstructuredOf(objs []manifest.Object) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.Unstructured
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// shown quotes v for a message, cut to its first 40 characters when it is longer: an error
// never echoes a huge value whole.
func shown(v string) string {
	const most = 40
	if len(v) <= most {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%q... (%d characters)", v[:most], len(v))
}

// trimNode is a copy of node as the controller's cache keeps it (controllers.TrimNode), by the
// same rule (internal/nodetrim). A bundle's rules then read the same of a node offline as in
// the cluster.
func trimNode(node *unstructured.Unstructured) *unstructured.Unstructured {
	out := node.DeepCopy()
	nodetrim.Unstructured(out.Object)
	return out
}
