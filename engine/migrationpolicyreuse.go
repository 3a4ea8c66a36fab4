package engine

import (
	"context"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// Preparing a MigrationPolicy set incrementally.
//
// A controller prepares a new set after every policy change. Most of the work is per policy
// and depends only on that policy (and the KubeVirt CR and the bundle): its entry in the
// index and the rules the partial evaluation of `matching` makes for it. The engine keeps
// those of the last set it prepared and reuses them for the policies of the next set that are
// the same (equal as stored, same name), so one changed policy costs its own entry, its own
// partial evaluation, and what depends on the whole set: the precedence order, and compiling
// the partially evaluated rules with the decision.
//
// The last set's work is reused only for the same bundle generation and an equal KubeVirt CR;
// when more than half the policies changed the set is prepared afresh, as the first one.

// policyMemo is the per-policy work of the set the engine prepared last, with the bundle
// generation it is for. It holds no prepared query, so it never keeps a compiled set alive.
type policyMemo struct {
	gen   *generation
	reuse *policyReuse
}

// policyReuse is what a prepared set leaves for the next one.
type policyReuse struct {
	kubevirt *ast.Term
	// inputs are the policies as converted, by name.
	inputs map[string]*ast.Term
	// entries and malformed are the index's entries of well-formed policies and messages of
	// malformed ones, by name.
	entries   map[string]*ast.Term
	malformed map[string]*ast.Term
	// rules are the partially evaluated rules of each policy, nil when they could not be told
	// apart by policy (then the next set partially evaluates every policy).
	rules *partialPolicyRules
}

// partialPolicyRules are the rules of the partial evaluation of `matching`, by policy: each
// rule's key is the name of the policy it is for (see `matching`).
type partialPolicyRules struct {
	pkg    *ast.Package
	byName map[string]policyRules
}

// policyRules are one policy's partially evaluated rules, for its entry in its part.
type policyRules struct {
	entry *ast.Term
	part  string
	rules []*ast.Rule // pristine copies: the compiler rewrites the rules it compiles
}

// reusable returns the last prepared set's work when s may reuse it with generation g.
func (s *MigrationPolicies) reusable(g *generation) *policyReuse {
	last := s.engine.policyMemo.Load()
	if last == nil || last.gen != g || !last.reuse.kubevirt.Equal(s.kubevirt) {
		return nil
	}
	return last.reuse
}

// evalIndex evaluates the index of s's policies with generation g, computing only the entries
// of policies that prev does not hold.
func (s *MigrationPolicies) evalIndex(ctx context.Context, g *generation, prev *policyReuse) (*ast.Term, *policyReuse, int, error) {
	var changed []*ast.Term
	if prev != nil {
		for i, name := range s.names {
			if old, ok := prev.inputs[name]; !ok || name == "" || !old.Equal(s.terms[i]) {
				changed = append(changed, s.terms[i])
			}
		}
	}
	if prev == nil || 2*len(changed) > len(s.terms) {
		t, err := g.eval(ctx, entryMigrationPolicyIndex, ast.NewObject(item("policies", s.policies), item("kubevirt", s.kubevirt)))
		if err != nil {
			return nil, nil, 0, err
		}
		next, err := s.reuseOf(t, nil, nil)
		if err != nil || len(next.entries)+len(next.malformed) != len(s.names) {
			// Not every policy is an entry or malformed (a bundle whose index differs from
			// the shipped one): leave nothing to reuse.
			next = &policyReuse{kubevirt: s.kubevirt}
		}
		return t, next, 0, nil
	}
	var fresh *ast.Term
	if len(changed) > 0 {
		var err error
		fresh, err = g.eval(ctx, entryMigrationPolicyIndex, ast.NewObject(item("policies", ast.ArrayTerm(changed...)), item("kubevirt", s.kubevirt)))
		if err != nil {
			return nil, nil, 0, err
		}
	}
	next, err := s.reuseOf(fresh, prev, changed)
	if err != nil || len(next.entries)+len(next.malformed) != len(s.names) {
		return s.evalIndex(ctx, g, nil)
	}
	entries := make([]*ast.Term, 0, len(next.entries))
	for _, name := range s.names {
		if e, ok := next.entries[name]; ok {
			entries = append(entries, e)
		}
	}
	malformed := make([][2]*ast.Term, 0, len(next.malformed))
	for name, msg := range next.malformed {
		malformed = append(malformed, ast.Item(ast.StringTerm(name), msg))
	}
	t, err := g.eval(ctx, entryMigrationPolicyIndex, ast.NewObject(
		item("entries", ast.ArrayTerm(entries...)),
		item("malformed", ast.ObjectTerm(malformed...)),
		item("kubevirt", s.kubevirt),
	))
	if err != nil {
		return nil, nil, 0, err
	}
	if assembled, err := s.reuseOf(t, nil, nil); err != nil || len(assembled.entries) != len(entries) || len(assembled.malformed) != len(malformed) {
		// The bundle's index does not read entries as the shipped one does: index afresh.
		return s.evalIndex(ctx, g, nil)
	}
	return t, next, len(s.terms) - len(changed), nil
}

// reuseOf is what s leaves for the next set: the entries and malformed policies of index t
// (of the changed policies, or of all when prev is nil), the others' from prev.
func (s *MigrationPolicies) reuseOf(t *ast.Term, prev *policyReuse, changed []*ast.Term) (*policyReuse, error) {
	next := &policyReuse{
		kubevirt: s.kubevirt, inputs: make(map[string]*ast.Term, len(s.names)),
		entries: make(map[string]*ast.Term, len(s.names)), malformed: map[string]*ast.Term{},
	}
	for i, name := range s.names {
		next.inputs[name] = s.terms[i]
	}
	if t != nil {
		idx, ok := t.Value.(ast.Object)
		if !ok {
			return nil, fmt.Errorf("%s: want an object, got %s", entryMigrationPolicyIndex, ast.ValueName(t.Value))
		}
		for key, into := range map[string]map[string]*ast.Term{"policies": next.entries, "malformed": next.malformed} {
			if err := namedTerms(idx.Get(ast.StringTerm(key)), into); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", entryMigrationPolicyIndex, key, err)
			}
		}
	}
	if prev != nil {
		fresh := make(map[*ast.Term]bool, len(changed))
		for _, c := range changed {
			fresh[c] = true
		}
		for i, name := range s.names {
			if fresh[s.terms[i]] {
				continue
			}
			if e, ok := prev.entries[name]; ok {
				next.entries[name] = e
			}
			if m, ok := prev.malformed[name]; ok {
				next.malformed[name] = m
			}
		}
	}
	return next, nil
}

// namedTerms copies an object of name -> term into out.
func namedTerms(t *ast.Term, out map[string]*ast.Term) error {
	if t == nil {
		return nil
	}
	obj, ok := t.Value.(ast.Object)
	if !ok {
		return fmt.Errorf("want an object, got %s", ast.ValueName(t.Value))
	}
	return obj.Iter(func(k, v *ast.Term) error {
		name, ok := k.Value.(ast.String)
		if !ok {
			return fmt.Errorf("want names as keys, got %s", ast.ValueName(k.Value))
		}
		out[string(name)] = v
		return nil
	})
}

// partialIndex partially evaluates `matching` for index t and prepares the decision with it,
// evaluating again only the policies whose entry or part differ from prev's. It records the
// rules by policy in next and returns how many policies' rules were reused.
func (s *MigrationPolicies) partialIndex(ctx context.Context, g *generation, t *ast.Term, prev, next *policyReuse) (*rego.PreparedEvalQuery, int, error) {
	parts, err := policyParts(t)
	if err != nil {
		return nil, 0, err
	}
	input := func(index *ast.Term) ast.Value {
		return ast.NewObject(item("index", index), item("kubevirt", s.kubevirt))
	}
	var changed []string // names of the policies to evaluate
	reused, incremental := 0, prev != nil && prev.rules != nil && parts != nil
	if incremental {
		for name, p := range parts {
			if old, ok := prev.rules.byName[name]; ok && old.part == p.part && old.entry.Equal(next.entries[name]) {
				reused++
			} else {
				changed = append(changed, name)
			}
		}
		incremental = 2*reused >= len(parts)
	}
	if !incremental {
		support, err := g.partialSupport(ctx, partialMatching, input(t))
		if err != nil || support == nil {
			return nil, 0, err
		}
		next.rules = splitPolicyRules(support, parts, next.entries)
		pq, err := g.preparePartial(ctx, partialMatching, support)
		return pq, 0, err
	}
	rules := &partialPolicyRules{pkg: prev.rules.pkg, byName: make(map[string]policyRules, len(parts))}
	for name, p := range parts {
		if old, ok := prev.rules.byName[name]; ok && old.part == p.part && old.entry.Equal(next.entries[name]) {
			rules.byName[name] = old
		}
	}
	if len(changed) > 0 {
		support, err := g.partialSupport(ctx, partialMatching, input(withParts(t, parts, changed)))
		if err != nil {
			return nil, 0, err
		}
		fresh := splitPolicyRules(support, parts, next.entries)
		if support == nil || fresh == nil || (fresh.pkg != nil && rules.pkg != nil && !fresh.pkg.Equal(rules.pkg)) {
			// Not told apart by policy: evaluate every policy, as for a first set.
			return s.partialIndex(ctx, g, t, nil, next)
		}
		if rules.pkg == nil {
			rules.pkg = fresh.pkg
		}
		for _, name := range changed {
			rules.byName[name] = fresh.byName[name]
		}
	}
	next.rules = rules
	module := rules.module()
	if module == nil || len(module.Rules) == 0 {
		return nil, reused, nil
	}
	pq, err := g.preparePartial(ctx, partialMatching, []*ast.Module{module})
	return pq, reused, err
}

// policyPart is a policy's part of the precedence order and its id.
type policyPart struct {
	part string
	id   *ast.Term
}

// policyPartsByName maps each indexed policy's name to its part and id.
type policyPartsByName map[string]policyPart

// policyParts reads the parts and order of index t; nil when it has neither (a bundle whose
// index differs: its partial evaluation is then never reused).
func policyParts(t *ast.Term) (policyPartsByName, error) {
	idx, ok := t.Value.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("%s: want an object, got %s", entryMigrationPolicyIndex, ast.ValueName(t.Value))
	}
	parts, _ := idx.Get(ast.StringTerm("parts")).Value.(ast.Object)
	order, _ := idx.Get(ast.StringTerm("order")).Value.(ast.Object)
	if parts == nil || order == nil {
		return nil, nil
	}
	out := policyPartsByName{}
	err := parts.Iter(func(k, v *ast.Term) error {
		part, ok := k.Value.(ast.String)
		ids, isArray := v.Value.(*ast.Array)
		if !ok || !isArray {
			return fmt.Errorf("%s: parts: want an object of arrays", entryMigrationPolicyIndex)
		}
		for i := range ids.Len() {
			id := ids.Elem(i)
			name, ok := order.Get(id).Value.(ast.String)
			if !ok {
				return fmt.Errorf("%s: order: no policy name for id %v", entryMigrationPolicyIndex, id)
			}
			out[string(name)] = policyPart{part: string(part), id: id}
		}
		return nil
	})
	return out, err
}

// withParts is index t with its parts restricted to the policies names: `matching` then makes
// rules for those policies alone.
func withParts(t *ast.Term, all policyPartsByName, names []string) *ast.Term {
	idx := t.Value.(ast.Object)
	ids := map[string][]*ast.Term{}
	for _, name := range names {
		p := all[name]
		ids[p.part] = append(ids[p.part], p.id)
	}
	parts := make([][2]*ast.Term, 0, len(ids))
	for part, list := range ids {
		parts = append(parts, ast.Item(ast.StringTerm(part), ast.ArrayTerm(list...)))
	}
	out := ast.NewObject()
	idx.Foreach(func(k, v *ast.Term) {
		if k.Equal(ast.StringTerm("parts")) {
			v = ast.ObjectTerm(parts...)
		}
		out.Insert(k, v)
	})
	return ast.NewTerm(out)
}

// splitPolicyRules sorts the support modules' rules by the policy they are for: every rule
// must be a rule of the partial evaluation of `matching` keyed by the name of a policy of
// parts, in one package. It returns nil otherwise.
func splitPolicyRules(support []*ast.Module, parts policyPartsByName, entries map[string]*ast.Term) *partialPolicyRules {
	if parts == nil {
		return nil
	}
	out := &partialPolicyRules{byName: make(map[string]policyRules, len(parts))}
	want := partialMatching.partialRef()
	for _, m := range support {
		if out.pkg == nil {
			out.pkg = m.Package.Copy()
		} else if !out.pkg.Equal(m.Package) {
			return nil
		}
		for _, r := range m.Rules {
			ref := m.Package.Path.Extend(r.Head.Ref().GroundPrefix()[:1])
			name, ok := r.Head.Key.Value.(ast.String)
			if !ok || !ref.Equal(want) || r.Else != nil {
				return nil
			}
			p, ok := parts[string(name)]
			if !ok {
				return nil
			}
			pr := out.byName[string(name)]
			pr.entry, pr.part = entries[string(name)], p.part
			pr.rules = append(pr.rules, r.Copy())
			out.byName[string(name)] = pr
		}
	}
	// A policy no VMI can match has no rule: remember that too.
	for name, p := range parts {
		if _, ok := out.byName[name]; !ok {
			out.byName[name] = policyRules{entry: entries[name], part: p.part}
		}
	}
	return out
}

// module is every policy's rules in one module, copied for the compiler; nil when there are
// none.
func (r *partialPolicyRules) module() *ast.Module {
	if r.pkg == nil {
		return nil
	}
	m := &ast.Module{Package: r.pkg.Copy()}
	for _, pr := range r.byName {
		for _, rule := range pr.rules {
			c := rule.Copy()
			c.Module = m
			m.Rules = append(m.Rules, c)
		}
	}
	return m
}
