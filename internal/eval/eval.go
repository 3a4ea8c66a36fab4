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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"

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
	// Live says the objects were read from a running cluster (eval --kubeconfig), where a
	// VirtualMachineInstanceMigration can outlive its VMI: such a migration is skipped with a
	// warning naming it, not an error.
	Live bool
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
	// Drift is, with Options.Drift, every stored value that differs from its decision.
	Drift []DriftResult `json:"drift,omitempty"`
}

// MigrationPolicyResult is the MigrationPolicy decision for one VMI.
type MigrationPolicyResult struct {
	VMI            string                              `json:"vmi"`
	Policy         *string                             `json:"policy"`
	MatchingLabels int                                 `json:"matchingLabels"`
	Configuration  kubevirtv1.VMIMConfigurationOptions `json:"configuration"`
	Explanation    *engine.MigrationPolicyExplanation  `json:"explanation,omitempty"`
}

// MigrationTargetResult is where one VirtualMachineInstanceMigration may take its VMI.
type MigrationTargetResult struct {
	Migration          string                             `json:"migration"`
	VMI                string                             `json:"vmi"`
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
}

// Run checks objs and decides for them. Malformed objects are errors naming file, document
// and field; all of them are reported and nothing is decided.
func Run(ctx context.Context, eng *engine.Engine, objs []manifest.Object, opts Options) (*Report, error) {
	warn := opts.Warn
	if warn == nil {
		warn = func(string) {}
	}
	in, err := sortInputs(objs, warn)
	if err != nil {
		return nil, err
	}
	warnDesignFields(objs, warn)
	if err := in.validate(ctx, eng, opts); err != nil {
		return nil, err
	}
	report := &Report{}
	if report.MigrationPolicies, err = in.migrationPolicies(ctx, eng, opts, warn); err != nil {
		return nil, err
	}
	done := opts.observe("nodeMigratability")
	nodes := eng.NewNodes()
	for _, o := range in.nodes {
		if err := nodes.Upsert(o.Unstructured); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Position(), err)
		}
	}
	if report.NodeMigratability, err = nodeMigratability(ctx, nodes); err != nil {
		return nil, err
	}
	done()
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
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	if report.Pools, err = in.pools(ctx, eng, now, opts, warn); err != nil {
		return nil, err
	}
	if opts.Drift {
		report.Drift = in.drift(report)
	}
	return report, nil
}

// namespacedKinds are the namespaced kinds eval reads.
var namespacedKinds = map[schema.GroupKind]bool{
	kindVMI: true, kindMigration: true, kindPod: true, kindPool: true, kindVirtualMachine: true, kindDataVolume: true,
}

func sortInputs(objs []manifest.Object, warn func(string)) (*inputs, error) {
	in := &inputs{namespaces: map[string]manifest.Object{}}
	seen := map[string]manifest.Object{}
	var errs []error
	for _, o := range objs {
		gk := o.GroupVersionKind().GroupKind()
		// Namespaced kinds without a namespace are in "default", as kubectl puts them: before
		// the duplicate check, so that v1 and default/v1 are one object, said twice.
		if namespacedKinds[gk] && o.GetNamespace() == "" {
			o.SetNamespace("default")
		}
		key := gk.String() + " " + o.GetNamespace() + "/" + o.GetName()
		if first, dup := seen[key]; dup {
			errs = append(errs, o.Errorf("metadata.name", "%s is also defined at %s", o.Describe(), first.Position()))
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
				errs = append(errs, err)
				continue
			}
			o.Unstructured = trimNode(o.Unstructured)
			in.nodes = append(in.nodes, o)
		case kindPod:
			in.pods = append(in.pods, o)
		case kindPool, kindVirtualMachine, kindDataVolume:
			switch gk {
			case kindPool:
				in.poolObjs = append(in.poolObjs, o)
			case kindVirtualMachine:
				in.vms = append(in.vms, o)
			default:
				in.dataVolumes = append(in.dataVolumes, o)
			}
		case kindKubeVirt:
			if in.kubevirt != nil {
				errs = append(errs, o.Errorf("kind", "a second KubeVirt CR (the first is at %s); a cluster has one", in.kubevirt.Position()))
				continue
			}
			in.kubevirt = &o
		default:
			warn(fmt.Sprintf("%s: ignoring %s %s: no decision reads it", o.Position(), o.GetAPIVersion(), o.Describe()))
		}
	}
	return in, errors.Join(errs...)
}

func (in *inputs) validate(ctx context.Context, eng *engine.Engine, opts Options) error {
	var errs []error
	for _, o := range in.vmis {
		errs = append(errs, checkLabels(o))
	}
	for _, name := range sortedKeys(in.namespaces) {
		errs = append(errs, checkLabels(in.namespaces[name]))
	}
	if in.kubevirt != nil {
		errs = append(errs, checkMigrationConfiguration(*in.kubevirt))
	}
	// Every policy against the same prepared set: each policy's own entry in it has its name,
	// so the validation takes it for its old version and ignores it. Each is checked as a
	// create, in the cluster of the KubeVirt CR given (its feature gates), if any.
	existing := eng.ExistingMigrationPolicies(unstructuredOf(in.policies))
	var kubevirt *unstructured.Unstructured
	if in.kubevirt != nil {
		kubevirt = in.kubevirt.Unstructured
	}
	for _, o := range in.policies {
		done := opts.observe("migrationPolicyValidation")
		violations, err := eng.ValidateMigrationPolicyAdmission(ctx, engine.MigrationPolicyAdmission{Policy: o.Unstructured, KubeVirt: kubevirt}, existing)
		done()
		if err != nil {
			return fmt.Errorf("%s: %w", o.Position(), err)
		}
		for _, v := range violations {
			errs = append(errs, o.Errorf(v.Field, "%s", v.Message))
		}
	}
	return errors.Join(errs...)
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
	var kubevirt *unstructured.Unstructured
	if in.kubevirt != nil {
		kubevirt = in.kubevirt.Unstructured
	}
	set, err := eng.MigrationPolicies(unstructuredOf(in.policies), kubevirt)
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
		subject := engine.MigrationPolicySubject{Namespace: o.GetNamespace(), Name: o.GetName(), Labels: o.GetLabels()}
		if ns, ok := in.namespaces[subject.Namespace]; ok {
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
			return nil, fmt.Errorf("%s: %w", o.Position(), err)
		}
		r := MigrationPolicyResultOf(subject.Key(), d)
		if opts.Explain {
			if r.Explanation, err = set.Explain(ctx, subject); err != nil {
				return nil, fmt.Errorf("%s: %w", o.Position(), err)
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
