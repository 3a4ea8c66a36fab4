package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// MigrationPolicySubject is what the MigrationPolicy decision reads of a
// VirtualMachineInstance and its Namespace.
type MigrationPolicySubject struct {
	Namespace string
	Name      string
	Labels    map[string]string
	// NamespaceLabels are the labels of the VMI's Namespace; nil when it is unknown.
	NamespaceLabels map[string]string
}

// Key is "<namespace>/<name>".
func (s MigrationPolicySubject) Key() string { return s.Namespace + "/" + s.Name }

// MigrationPolicyDecision is the policy a VMI obeys and its effective migration configuration.
type MigrationPolicyDecision struct {
	// Policy is the winning MigrationPolicy's name, "" when none matches.
	Policy string `json:"policy"`
	// MatchingLabels is the number of labels (VMI and namespace) the winner matched.
	MatchingLabels int `json:"matchingLabels"`
	// Configuration is KubeVirt's defaults overlaid by the KubeVirt CR, then by the policy, in
	// the type KubeVirt (v1.9) stores as a VMI's status.migrationState.migrationConfiguration.
	Configuration kubevirtv1.VMIMConfigurationOptions `json:"configuration"`
	// Revision is the bundle revision that decided.
	Revision string `json:"-"`
}

// MigrationPolicyExplanation lists every policy with whether it matched and why it lost.
type MigrationPolicyExplanation struct {
	Precedence string                     `json:"precedence"`
	Policy     *string                    `json:"policy"`
	Candidates []MigrationPolicyCandidate `json:"candidates"`
	Revision   string                     `json:"-"`
}

// MigrationPolicyCandidate is one policy as the decision saw it for one VMI.
type MigrationPolicyCandidate struct {
	Policy         string `json:"policy"`
	Matched        bool   `json:"matched"`
	MatchingLabels int    `json:"matchingLabels"`
	RequiredLabels int    `json:"requiredLabels"`
	Reason         string `json:"reason"`
}

// Violation is one reason an object is invalid, for admission and for offline checks.
type Violation struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (v Violation) String() string { return v.Field + ": " + v.Message }

// JoinViolations is violations as one line, "field: message; field: message", for admission
// denials and status conditions.
func JoinViolations(violations []Violation) string {
	msgs := make([]string, len(violations))
	for i, v := range violations {
		msgs[i] = v.String()
	}
	return strings.Join(msgs, "; ")
}

// MigrationPolicies is a set of MigrationPolicies and a KubeVirt CR, ready to decide for
// many VMIs. What does not depend on the VMI (the policy index) is computed once per bundle
// generation, on first use, reusing what the engine computed for the policies of the last set
// it prepared that are unchanged (migrationpolicyreuse.go). Safe for concurrent use; build a
// new one when policies change.
type MigrationPolicies struct {
	engine   *Engine
	policies *ast.Term   // array of terms
	terms    []*ast.Term // its elements
	names    []string    // the policies' names
	kubevirt *ast.Term
	count    int // of policies

	mu    sync.Mutex
	cache *policyIndex
}

type policyIndex struct {
	gen       *generation
	index     *ast.Term
	malformed map[string]string
	// decision is the decision prepared beside the partial evaluation of `matching` for these
	// policies (partial.go); nil when the bundle has none, and the generation's own decides.
	decision *rego.PreparedEvalQuery
	// configurations caches decoded configurations by the identity of the term a decision
	// returned. The shipped rules return the index's own per-policy term, so each is decoded
	// once; rules that build a configuration per VMI return new terms and are decoded anew.
	configurations sync.Map // *ast.Term -> *kubevirtv1.VMIMConfigurationOptions
}

// MigrationPolicies prepares policies (migrations.kubevirt.io/v1alpha1 MigrationPolicy, as
// stored) and the KubeVirt CR (nil when there is none) for decisions. It neither changes nor
// keeps the objects: a caller may pass those of an informer's cache without copying them.
// A policy with the UID and resourceVersion of one of the last set prepared is taken as that
// one was converted (the API server gives one object version one resourceVersion), so a set
// that differs from the last by one policy converts that policy alone.
func (e *Engine) MigrationPolicies(policies []*unstructured.Unstructured, kubevirt *unstructured.Unstructured) (*MigrationPolicies, error) {
	// MigrationPolicies are cluster-scoped: a cluster has one of a name, and the rules index
	// them by name. Two of one name are an error naming both, never a Rego conflict.
	seen := make(map[string]int, len(policies))
	for i, p := range policies {
		if j, dup := seen[p.GetName()]; dup {
			return nil, fmt.Errorf("migration policies: %w: MigrationPolicy %q given twice (policies %d and %d)", ErrMalformedInput, p.GetName(), j, i)
		}
		seen[p.GetName()] = i
	}
	terms, names, err := e.convertPolicies(policies)
	if err != nil {
		return nil, fmt.Errorf("migration policies: %w", err)
	}
	kv, err := objectTerm(kubevirt)
	if err != nil {
		return nil, fmt.Errorf("migration policies: %w", err)
	}
	return &MigrationPolicies{engine: e, policies: ast.ArrayTerm(terms...), terms: terms, names: names, kubevirt: kv, count: len(policies)}, nil
}

// convertedPolicy is a policy as converted, with the object version it was converted from.
type convertedPolicy struct {
	uid, resourceVersion string
	term                 *ast.Term
}

// convertPolicies converts policies, taking the term of the last set's conversion for each
// policy of the same name, UID and resourceVersion (objects without both, such as files given
// to eval, are always converted), and keeps this set's terms for the next.
func (e *Engine) convertPolicies(policies []*unstructured.Unstructured) ([]*ast.Term, []string, error) {
	var last map[string]convertedPolicy
	if p := e.policyTerms.Load(); p != nil {
		last = *p
	}
	next := make(map[string]convertedPolicy, len(policies))
	terms := make([]*ast.Term, len(policies))
	names := make([]string, len(policies))
	for i, p := range policies {
		c := convertedPolicy{uid: string(p.GetUID()), resourceVersion: p.GetResourceVersion()}
		if old, ok := last[p.GetName()]; ok && c.uid != "" && c.resourceVersion != "" && old.uid == c.uid && old.resourceVersion == c.resourceVersion {
			c.term = old.term
		} else {
			t, err := policyTerm(p)
			if err != nil {
				return nil, nil, err
			}
			c.term = t
		}
		terms[i], names[i] = c.term, p.GetName()
		next[names[i]] = c
	}
	e.policyTerms.Store(&next)
	return terms, names, nil
}

// The annotations in which virt-rules' status controller keeps what a MigrationPolicy's status
// would say: KubeVirt's MigrationPolicy status has no fields (the API server prunes whatever is
// written there).
const (
	// AnnotationPolicyVMIs holds the number of VMIs that obey the policy (decimal).
	AnnotationPolicyVMIs = "migrations.virt-rules.io/virtual-machine-instances"
	// AnnotationPolicyValid is "true" when the policy passes the bundle's validation decision,
	// else "false".
	AnnotationPolicyValid = "migrations.virt-rules.io/valid"
	// AnnotationPolicyInvalidReason holds the validation decision's messages of an invalid
	// policy.
	AnnotationPolicyInvalidReason = "migrations.virt-rules.io/invalid-reason"
)

// PolicyStatusAnnotations are the status annotations of a MigrationPolicy: no decision reads
// them (policyTerm).
var PolicyStatusAnnotations = []string{AnnotationPolicyVMIs, AnnotationPolicyValid, AnnotationPolicyInvalidReason}

// policyTerm is policy as the decisions read it: as stored, without what its status writes
// change: status, the status annotations (PolicyStatusAnnotations), resourceVersion and
// managedFields. What the cluster says of a policy (virt-rules' own count of the VMIs obeying
// it among it) is never an input of which VMIs obey it, or a decision would follow its own
// output; and without them, a policy whose status alone changed is the same input, so the set
// prepared next reuses its work (migrationpolicyreuse.go).
func policyTerm(policy *unstructured.Unstructured) (*ast.Term, error) {
	// Shallow copies of the levels trimmed: the policy itself (an informer's) is left as it is.
	obj := maps.Clone(policy.Object)
	delete(obj, "status")
	if meta, ok := obj["metadata"].(map[string]any); ok {
		meta = maps.Clone(meta)
		delete(meta, "resourceVersion")
		delete(meta, "managedFields")
		if annotations, ok := meta["annotations"].(map[string]any); ok {
			annotations = maps.Clone(annotations)
			for _, k := range PolicyStatusAnnotations {
				delete(annotations, k)
			}
			// A policy with status annotations alone is as it was before the first.
			if len(annotations) > 0 {
				meta["annotations"] = annotations
			} else {
				delete(meta, "annotations")
			}
		}
		obj["metadata"] = meta
	}
	return objectTerm(&unstructured.Unstructured{Object: obj})
}

// Malformed returns the policies the decision cannot use (name -> why). They never match.
func (s *MigrationPolicies) Malformed(ctx context.Context) (map[string]string, error) {
	idx, err := s.index(ctx, s.engine.active.Load())
	if err != nil {
		return nil, err
	}
	return idx.malformed, nil
}

// index returns the policy index for generation g, computing it when g is new to this set,
// and partially evaluates the policies the VMIs match with it.
func (s *MigrationPolicies) index(ctx context.Context, g *generation) (*policyIndex, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache != nil && s.cache.gen == g {
		return s.cache, nil
	}
	start := time.Now()
	prev := s.reusable(g)
	t, reuse, reusedEntries, err := s.evalIndex(ctx, g, prev)
	if err != nil {
		return nil, fmt.Errorf("migration policies: %w", err)
	}
	idx := &policyIndex{gen: g, index: t, malformed: map[string]string{}}
	if m, ok := t.Value.(ast.Object); ok {
		if bad := m.Get(ast.StringTerm("malformed")); bad != nil {
			if err := decode(bad, &idx.malformed); err != nil {
				return nil, fmt.Errorf("decode malformed policies: %w", err)
			}
		}
	}
	var reusedRules int
	idx.decision, reusedRules, err = s.partialIndex(ctx, g, t, prev, reuse)
	if err != nil {
		return nil, fmt.Errorf("migration policies: %w", err)
	}
	s.engine.log.InfoContext(ctx, "migration policies prepared", "revision", g.revision,
		"policies", s.count, "partiallyEvaluated", idx.decision != nil, "reusedEntries", reusedEntries,
		"reusedPartialRules", reusedRules, "duration", time.Since(start))
	s.cache = idx
	s.engine.policyMemo.Store(&policyMemo{gen: g, reuse: reuse})
	return idx, nil
}

func (s *MigrationPolicies) input(idx *policyIndex, vmi MigrationPolicySubject) ast.Value {
	namespace := ast.NullTerm()
	if vmi.NamespaceLabels != nil {
		namespace = ast.ObjectTerm(item("metadata", ast.ObjectTerm(
			item("name", stringTerm(vmi.Namespace)),
			item("labels", labelsTerm(vmi.NamespaceLabels)),
		)))
	}
	return ast.NewObject(
		item("vmi", ast.ObjectTerm(item("metadata", ast.ObjectTerm(
			item("name", stringTerm(vmi.Name)),
			item("namespace", stringTerm(vmi.Namespace)),
			item("labels", labelsTerm(vmi.Labels)),
		)))),
		item("namespace", namespace),
		item("kubevirt", s.kubevirt),
		item("index", idx.index),
	)
}

// Decide returns the MigrationPolicy vmi obeys and its effective migration configuration.
func (s *MigrationPolicies) Decide(ctx context.Context, vmi MigrationPolicySubject) (*MigrationPolicyDecision, error) {
	g, idx, t, err := s.eval(ctx, vmi, entryMigrationPolicy)
	if err != nil {
		return nil, err
	}
	d := &MigrationPolicyDecision{Revision: g.revision}
	if err := idx.decodeDecision(t, d); err != nil {
		return nil, fmt.Errorf("vmi %s: decode %s decision: %w", vmi.Key(), entryMigrationPolicy, err)
	}
	return d, nil
}

// eval runs entry for vmi on the serving generation, with the set's index for it.
func (s *MigrationPolicies) eval(ctx context.Context, vmi MigrationPolicySubject, entry string) (*generation, *policyIndex, *ast.Term, error) {
	g := s.engine.active.Load()
	idx, err := s.index(ctx, g)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("vmi %s: %w", vmi.Key(), err)
	}
	var pq *rego.PreparedEvalQuery
	if entry == partialMatching.decision {
		pq = idx.decision
	}
	t, err := g.evalWith(ctx, entry, pq, s.input(idx, vmi))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("vmi %s: %w", vmi.Key(), err)
	}
	return g, idx, t, nil
}

func (idx *policyIndex) decodeDecision(t *ast.Term, d *MigrationPolicyDecision) error {
	obj, ok := t.Value.(ast.Object)
	if !ok {
		return fmt.Errorf("want an object, got %v", ast.ValueName(t.Value))
	}
	switch p := obj.Get(ast.StringTerm("policy")).Value.(type) {
	case ast.String:
		d.Policy = string(p)
	case ast.Null:
	default:
		return fmt.Errorf("policy: want a string or null, got %v", ast.ValueName(p))
	}
	if n, ok := obj.Get(ast.StringTerm("matchingLabels")).Value.(ast.Number); ok {
		i, _ := n.Int()
		d.MatchingLabels = i
	}
	cfg := obj.Get(ast.StringTerm("configuration"))
	if cfg == nil {
		return errors.New("configuration: missing")
	}
	if cached, ok := idx.configurations.Load(cfg); ok {
		d.Configuration = *cached.(*kubevirtv1.VMIMConfigurationOptions).DeepCopy()
		return nil
	}
	if err := decode(cfg, &d.Configuration); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	idx.configurations.Store(cfg, d.Configuration.DeepCopy())
	return nil
}

// Explain lists every policy for vmi: whether it matched, its score and why it won or lost.
func (s *MigrationPolicies) Explain(ctx context.Context, vmi MigrationPolicySubject) (*MigrationPolicyExplanation, error) {
	g, _, t, err := s.eval(ctx, vmi, entryMigrationPolicyExplanation)
	if err != nil {
		return nil, err
	}
	x := &MigrationPolicyExplanation{Revision: g.revision}
	if err := decode(t, x); err != nil {
		return nil, fmt.Errorf("vmi %s: decode %s: %w", vmi.Key(), entryMigrationPolicyExplanation, err)
	}
	return x, nil
}
