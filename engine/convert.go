package engine

import (
	"bytes"
	"encoding/json"
	"fmt"

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
