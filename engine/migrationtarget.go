package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The reasons a migration has no target node, in the order they are checked (design 001's
// negative tests). They are a public contract: VMIM conditions and events carry them.
const (
	ReasonInvalidTerm = "InvalidTerm"
	// ReasonInvalidInput extends the design's codes: the VMI, nodes or pods given are
	// malformed (checked right after InvalidTerm), so no answer would be trustworthy.
	ReasonInvalidInput               = "InvalidInput"
	ReasonNodeNotFound               = "NodeNotFound"
	ReasonAlreadyOnNode              = "AlreadyOnNode"
	ReasonConflictsWithVMConstraints = "ConflictsWithVMConstraints"
	ReasonNoCapacity                 = "NoCapacity"
	ReasonNoMatchingNode             = "NoMatchingNode"
)

// MigrationTargetDecision is where a VirtualMachineInstanceMigration may take its VMI.
type MigrationTargetDecision struct {
	// CandidateNodes are the nodes the target pod may land on, sorted.
	CandidateNodes []string `json:"candidateNodes"`
	// TargetNodeAffinity is the VMI's node affinity with the migration's added term ANDed
	// into every required term: what the target virt-launcher pod gets. The VMI keeps its own.
	TargetNodeAffinity *corev1.NodeAffinity `json:"targetNodeAffinity"`
	// Error says why there is no candidate; nil when there is one.
	Error *MigrationTargetError `json:"error"`
	// Revision is the bundle revision that decided.
	Revision string `json:"-"`
}

// MigrationTargetError is why a migration has no target: one of the Reason* codes.
type MigrationTargetError struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func (e *MigrationTargetError) Error() string { return e.Reason + ": " + e.Message }

// MigrationTargetExplanation says, node by node, why each node is or is not a candidate.
type MigrationTargetExplanation struct {
	Nodes []struct {
		Node      string `json:"node"`
		Candidate bool   `json:"candidate"`
		Reason    string `json:"reason"`
	} `json:"nodes"`
	Revision string `json:"-"`
}

// MigrationTargetInput is what the migration target decision reads.
type MigrationTargetInput struct {
	// Migration is the VirtualMachineInstanceMigration as stored; VMI the one it migrates.
	Migration, VMI *unstructured.Unstructured
	// SourcePod is the VMI's current virt-launcher pod (see SourceLauncherPod); nil if
	// unknown: a host-model VMI's CPU is then read from its node's labels, what KubeVirt's
	// renderer derives from the VMI is not known, and the messages say so.
	SourcePod *unstructured.Unstructured
	// KubeVirt is the cluster's KubeVirt CR, whose developerConfiguration.nodeSelectors
	// virt-controller puts on every launcher pod; nil if unknown (then none are required).
	KubeVirt *unstructured.Unstructured
	// Nodes are the cluster's nodes.
	Nodes *Nodes
	// Pods are pods on the nodes, whose requests count against node allocatable.
	Pods []*unstructured.Unstructured
}

// MigrationTarget decides which nodes in.Migration may take its VMI to.
func (e *Engine) MigrationTarget(ctx context.Context, in MigrationTargetInput) (*MigrationTargetDecision, error) {
	d := &MigrationTargetDecision{}
	rev, err := e.evalMigrationTarget(ctx, entryMigrationTarget, in, d)
	if err != nil {
		return nil, err
	}
	d.Revision = rev
	if d.CandidateNodes == nil {
		d.CandidateNodes = []string{}
	}
	return d, nil
}

// ExplainMigrationTarget lists every node with why it is or is not a candidate.
func (e *Engine) ExplainMigrationTarget(ctx context.Context, in MigrationTargetInput) (*MigrationTargetExplanation, error) {
	x := &MigrationTargetExplanation{}
	rev, err := e.evalMigrationTarget(ctx, entryMigrationTargetExplanation, in, x)
	if err != nil {
		return nil, err
	}
	x.Revision = rev
	return x, nil
}

// evalMigrationTarget runs entry on the migration's input and decodes its value into out,
// returning the revision of the bundle that decided.
func (e *Engine) evalMigrationTarget(ctx context.Context, entry string, in MigrationTargetInput, out any) (string, error) {
	if in.Migration == nil {
		return "", errors.New("migration target: no migration")
	}
	key := in.Migration.GetNamespace() + "/" + in.Migration.GetName()
	optional := func(what string, o *unstructured.Unstructured) (*ast.Term, error) {
		if o == nil {
			return ast.NullTerm(), nil
		}
		t, err := objectTerm(o)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %s: %w", key, what, err)
		}
		return t, nil
	}
	source, err := optional("source pod", in.SourcePod)
	if err != nil {
		return "", err
	}
	kubevirt, err := optional("KubeVirt CR", in.KubeVirt)
	if err != nil {
		return "", err
	}
	var terms [2]*ast.Term
	for i, o := range []*unstructured.Unstructured{in.Migration, in.VMI} {
		t, err := objectTerm(o)
		if err != nil {
			return "", fmt.Errorf("migration %s: %w", key, err)
		}
		terms[i] = t
	}
	pods, err := objectsTerm(in.Pods)
	if err != nil {
		return "", fmt.Errorf("migration %s: %w", key, err)
	}
	nodeList, err := in.Nodes.term()
	if err != nil {
		return "", fmt.Errorf("migration %s: %w", key, err)
	}
	g := e.active.Load()
	input := ast.NewObject(item("migration", terms[0]), item("vmi", terms[1]), item("nodes", nodeList), item("pods", pods),
		item("sourcePod", source), item("kubevirt", kubevirt))
	t, err := g.eval(ctx, entry, input)
	if err != nil {
		return "", fmt.Errorf("migration %s: %w", key, err)
	}
	if err := decode(t, out); err != nil {
		return "", fmt.Errorf("migration %s: decode %s: %w", key, entry, err)
	}
	return g.revision, nil
}

// SourceLauncherPod picks the VMI's current virt-launcher pod among pods, as virt-controller's
// CurrentVMIPod does: a pod the VMI controls (an ownerReference with controller true, kind
// VirtualMachineInstance, the VMI's name and, when both are known, UID; or, in manifests
// without ownerReferences, the label kubevirt.io/created-by with the VMI's UID), in the VMI's
// namespace, on the VMI's node when it has one; the most recently created, the last given on
// a tie. nil when there is none.
func SourceLauncherPod(vmi *unstructured.Unstructured, pods []*unstructured.Unstructured) *unstructured.Unstructured {
	node, _, _ := unstructured.NestedString(vmi.Object, "status", "nodeName")
	var current *unstructured.Unstructured
	for _, pod := range pods {
		if pod.GetNamespace() != vmi.GetNamespace() || !launcherOf(pod, vmi) {
			continue
		}
		if podNode, _, _ := unstructured.NestedString(pod.Object, "spec", "nodeName"); node != "" && podNode != node {
			continue
		}
		if current == nil || !pod.GetCreationTimestamp().Time.Before(current.GetCreationTimestamp().Time) {
			current = pod
		}
	}
	return current
}

func launcherOf(pod, vmi *unstructured.Unstructured) bool {
	for _, ref := range pod.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "VirtualMachineInstance" && ref.Name == vmi.GetName() &&
			(ref.UID == "" || vmi.GetUID() == "" || ref.UID == vmi.GetUID()) {
			return true
		}
	}
	return vmi.GetUID() != "" && pod.GetLabels()["kubevirt.io/created-by"] == string(vmi.GetUID())
}

// SchedulingAffinity is the node affinity a host-model VMI's launcher pod gets at its first
// scheduling from the KubeVirt CR's migratability knobs (design 002), or nil when nothing is
// to be added. Invalid knobs are a *FieldError naming the KubeVirt CR's field.
func (e *Engine) SchedulingAffinity(ctx context.Context, vmi, kubevirt *unstructured.Unstructured) (*corev1.NodeAffinity, error) {
	v, err := objectTerm(vmi)
	if err != nil {
		return nil, err
	}
	kv, err := objectTerm(kubevirt)
	if err != nil {
		return nil, err
	}
	g := e.active.Load()
	t, err := g.eval(ctx, entrySchedulingAffinity, ast.NewObject(item("vmi", v), item("kubevirt", kv)))
	if err != nil {
		return nil, fmt.Errorf("vmi %s/%s: %w", vmi.GetNamespace(), vmi.GetName(), err)
	}
	if _, ok := t.Value.(ast.Null); ok {
		return nil, nil
	}
	if obj, ok := t.Value.(ast.Object); ok {
		if msg := obj.Get(ast.StringTerm("error")); msg != nil {
			if text, ok := msg.Value.(ast.String); ok {
				return nil, fieldError(string(text))
			}
			return nil, fmt.Errorf("%w: %v", ErrMalformedInput, msg)
		}
	}
	var affinity corev1.NodeAffinity
	if err := decode(t, &affinity); err != nil {
		return nil, fmt.Errorf("vmi %s/%s: decode %s: %w", vmi.GetNamespace(), vmi.GetName(), entrySchedulingAffinity, err)
	}
	return &affinity, nil
}

// MigrationTargetPodAffinity is the node affinity of migration's target virt-launcher pod:
// podAffinity (the pod's own, as KubeVirt built it; nil if none) with the migration's added
// term ANDed into every required term. It is nil when the migration adds no requirement (the
// pod keeps what it has). An invalid added term is a *FieldError naming the field.
func (e *Engine) MigrationTargetPodAffinity(ctx context.Context, migration *unstructured.Unstructured, podAffinity *corev1.NodeAffinity) (*corev1.NodeAffinity, error) {
	key := migration.GetNamespace() + "/" + migration.GetName()
	m, err := objectTerm(migration)
	if err != nil {
		return nil, fmt.Errorf("migration %s: %w", key, err)
	}
	own := ast.NullTerm()
	if podAffinity != nil {
		if own, err = valueTerm(podAffinity); err != nil {
			return nil, fmt.Errorf("migration %s: pod node affinity: %w", key, err)
		}
	}
	g := e.active.Load()
	t, err := g.eval(ctx, entryMigrationTargetPodAffinity, ast.NewObject(item("migration", m), item("nodeAffinity", own)))
	if err != nil {
		return nil, fmt.Errorf("migration %s: %w", key, err)
	}
	if _, ok := t.Value.(ast.Null); ok {
		return nil, nil
	}
	if obj, ok := t.Value.(ast.Object); ok {
		if msg := obj.Get(ast.StringTerm("error")); msg != nil {
			if text, ok := msg.Value.(ast.String); ok {
				return nil, fmt.Errorf("migration %s: %w", key, fieldError(string(text)))
			}
			return nil, fmt.Errorf("migration %s: %w: %v", key, ErrMalformedInput, msg)
		}
	}
	var affinity corev1.NodeAffinity
	if err := decode(t, &affinity); err != nil {
		return nil, fmt.Errorf("migration %s: decode %s: %w", key, entryMigrationTargetPodAffinity, err)
	}
	return &affinity, nil
}

// ValidateMigration checks the constraint a VirtualMachineInstanceMigration adds (its
// addedNodeSelectorTerm, addedNodeSelector or annotation) as an admission webhook would,
// without the VMI or nodes. It returns the violations, sorted; none means valid.
func (e *Engine) ValidateMigration(ctx context.Context, migration *unstructured.Unstructured) ([]Violation, error) {
	m, err := objectTerm(migration)
	if err != nil {
		return nil, err
	}
	g := e.active.Load()
	t, err := g.eval(ctx, entryMigrationTermValidation, ast.NewObject(item("migration", m)))
	if err != nil {
		return nil, fmt.Errorf("validate migration %s/%s: %w", migration.GetNamespace(), migration.GetName(), err)
	}
	var msgs []string
	if err := decode(t, &msgs); err != nil {
		return nil, fmt.Errorf("validate migration %s/%s: decode: %w", migration.GetNamespace(), migration.GetName(), err)
	}
	slices.Sort(msgs)
	violations := make([]Violation, len(msgs))
	for i, msg := range msgs {
		fe := fieldError(msg)
		violations[i] = Violation{Field: fe.Field, Message: fe.Message}
	}
	return violations, nil
}
