package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Decisions read Kubernetes objects exactly as the API server stores them, so that shapes a
// typed Go struct would drop (the design's matchLabels selectors, fields newer than the Go
// types) reach the rules. These helpers build AST values directly, without a JSON trip.

func stringTerm(s string) *ast.Term { return ast.StringTerm(s) }

func item(key string, value *ast.Term) [2]*ast.Term { return ast.Item(ast.StringTerm(key), value) }

func labelsTerm(labels map[string]string) *ast.Term {
	items := make([][2]*ast.Term, 0, len(labels))
	for k, v := range labels {
		items = append(items, item(k, ast.StringTerm(v)))
	}
	return ast.ObjectTerm(items...)
}

// objectTerm converts an unstructured object; nil gives null.
func objectTerm(u *unstructured.Unstructured) (*ast.Term, error) {
	if u == nil {
		return ast.NullTerm(), nil
	}
	v, err := ast.InterfaceToValue(u.Object)
	if err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return ast.NewTerm(v), nil
}

func objectsTerm(objs []*unstructured.Unstructured) (*ast.Term, error) {
	terms := make([]*ast.Term, 0, len(objs))
	for _, o := range objs {
		t, err := objectTerm(o)
		if err != nil {
			return nil, err
		}
		terms = append(terms, t)
	}
	return ast.ArrayTerm(terms...), nil
}

// decode fills out (a pointer to a Go struct with json tags) from a decision's value.
func decode(t *ast.Term, out any) error {
	v, err := ast.JSON(t.Value)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// valueTerm converts a typed Go value (with json tags, such as a corev1 struct) through its
// JSON form, as the API server would store it.
func valueTerm(v any) (*ast.Term, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	// Numbers as their JSON text: an int64 beyond 2^53 keeps every digit.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	value, err := ast.InterfaceToValue(generic)
	if err != nil {
		return nil, err
	}
	return ast.NewTerm(value), nil
}

// termBuilder converts objects as decoded from JSON into AST values, the values
// ast.InterfaceToValue gives, with fewer allocations: terms taken from blocks of many, one
// scratch list of an object's items (ast.NewObject copies them), and each distinct string once
// per builder (a list of a thousand VMs repeats the same keys, "metadata", "name", ..., and
// many values, a template hash, "True": they share one term). So do equal small objects of
// scalars (the ownerReferences, labels and annotations every VM of a pool has alike): they
// share one value. A builder is for one input; it is not safe for concurrent use. With a cache
// (WithObjectCache), objects converted before are taken from it, and those converted are kept.
type termBuilder struct {
	cache   *objectCache
	strings map[string]*ast.Term
	leaves  map[string]ast.Value
	key     []byte
	terms   []ast.Term
	ptrs    []*ast.Term
	items   [][2]*ast.Term
}

// leafKeys is how many keys an object may have at most to be shared as a leaf.
const leafKeys = 8

// termBlock is how many terms (and term pointers) a builder allocates at once.
const termBlock = 1024

func newTermBuilder(cache *objectCache) *termBuilder {
	return &termBuilder{cache: cache, strings: make(map[string]*ast.Term, 256), leaves: make(map[string]ast.Value, 64)}
}

// object converts u; nil gives null.
func (b *termBuilder) object(u *unstructured.Unstructured) (*ast.Term, error) {
	if u == nil {
		return ast.NullTerm(), nil
	}
	if b.cache != nil {
		if t, ok := b.cache.get(u); ok {
			return t, nil
		}
	}
	v, err := b.value(u.Object)
	if err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	t := ast.NewTerm(v)
	if b.cache != nil {
		b.cache.put(u, t)
	}
	return t, nil
}

// objects converts a list of objects into an array; nil objects give null.
func (b *termBuilder) objects(objs []*unstructured.Unstructured) (*ast.Term, error) {
	terms := make([]*ast.Term, len(objs))
	for i, o := range objs {
		t, err := b.object(o)
		if err != nil {
			return nil, err
		}
		terms[i] = t
	}
	return ast.ArrayTerm(terms...), nil
}

func (b *termBuilder) string(s string) *ast.Term {
	t, ok := b.strings[s]
	if !ok {
		t = ast.StringTerm(s)
		b.strings[s] = t
	}
	return t
}

// term is a new term of v, from the current block.
func (b *termBuilder) term(v ast.Value) *ast.Term {
	if len(b.terms) == 0 {
		b.terms = make([]ast.Term, termBlock)
	}
	t := &b.terms[0]
	b.terms = b.terms[1:]
	t.Value = v
	return t
}

// pointers are n term pointers of the current block, for an array to keep.
func (b *termBuilder) pointers(n int) []*ast.Term {
	if n > termBlock {
		return make([]*ast.Term, n)
	}
	if len(b.ptrs) < n {
		b.ptrs = make([]*ast.Term, termBlock)
	}
	p := b.ptrs[:n:n]
	b.ptrs = b.ptrs[n:]
	return p
}

func (b *termBuilder) value(x any) (ast.Value, error) {
	switch x := x.(type) {
	case string:
		return b.string(x).Value, nil
	case map[string]any:
		key, leaf := b.leafKey(x)
		if leaf {
			if v, ok := b.leaves[string(key)]; ok {
				return v, nil
			}
		}
		// Values first: converting one may use the scratch list of items.
		start := len(b.items)
		for k, v := range x {
			value, err := b.value(v)
			if err != nil {
				b.items = b.items[:start]
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			b.items = append(b.items, [2]*ast.Term{b.string(k), b.term(value)})
		}
		obj := ast.NewObject(b.items[start:]...)
		clear(b.items[start:])
		b.items = b.items[:start]
		if leaf {
			b.leaves[string(key)] = obj
		}
		return obj, nil
	case []any:
		elems := b.pointers(len(x))
		for i, e := range x {
			value, err := b.value(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			elems[i] = b.term(value)
		}
		return ast.NewArray(elems...), nil
	default:
		return ast.InterfaceToValue(x)
	}
}

// leafKey is the identity of x, an object of at most leafKeys keys whose values are all
// strings, booleans, nulls, int64 or float64 (numbers as decoded from JSON), as the text of
// its keys and values in key order, each tagged with its type and strings prefixed with their
// length (not quoted: quoting looks at every rune, and was most of the key's cost); leaf is
// false for any other object. The key is the builder's scratch buffer: valid until the next
// call.
func (b *termBuilder) leafKey(x map[string]any) (key []byte, leaf bool) {
	if len(x) == 0 || len(x) > leafKeys {
		return nil, false
	}
	var names [leafKeys]string
	keys := names[:0]
	for k, v := range x {
		switch v.(type) {
		case string, bool, nil, int64, float64:
		default:
			return nil, false // before sorting: most objects hold an object or a list
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	key = b.key[:0]
	for _, k := range keys {
		key = appendString(key, k)
		switch v := x[k].(type) {
		case string:
			key = appendString(append(key, 's'), v)
		case bool:
			key = strconv.AppendBool(append(key, 'b'), v)
		case nil:
			key = append(key, 'n')
		case int64:
			key = strconv.AppendInt(append(key, 'i'), v, 10)
		case float64:
			key = strconv.AppendFloat(append(key, 'f'), v, 'g', -1, 64)
		}
	}
	b.key = key
	return key, true
}

// appendString appends s to key as its length and its bytes: no two strings, nor a string and
// what follows it, append alike.
func appendString(key []byte, s string) []byte {
	return append(binary.AppendUvarint(key, uint64(len(s))), s...)
}
