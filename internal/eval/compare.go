package eval

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// Change is one decision two bundles make differently for the same object: the decision (the
// report's section), the object, the fields that differ (explanations aside), and each side's
// whole result, explanation included; a side is null when that bundle has no result for it.
type Change struct {
	Decision string          `json:"decision"`
	Object   string          `json:"object"`
	Fields   []string        `json:"fields"`
	Base     json.RawMessage `json:"base"`
	New      json.RawMessage `json:"new"`
}

// sections are the report's decisions, in report order, each with the key naming its object.
var sections = []struct{ name, key string }{
	{"migrationPolicies", "vmi"},
	{"migrationTargets", "migration"},
	{"nodeMigratability", "node"},
	{"schedulingAffinity", "vmi"},
	{"pools", "pool"},
	{"migrationCandidates", "vmi"},
	{"cpuBaseline", "group"},
}

// Compare lists every decision that differs between base and next, by section then object.
// Explanations are carried, never compared: only what a controller would act on counts.
func Compare(base, next *Report) ([]Change, error) {
	b, err := bySection(base)
	if err != nil {
		return nil, err
	}
	n, err := bySection(next)
	if err != nil {
		return nil, err
	}
	var changes []Change
	for _, s := range sections {
		objects := map[string]bool{}
		for k := range b[s.name] {
			objects[k] = true
		}
		for k := range n[s.name] {
			objects[k] = true
		}
		for _, object := range sortedKeys(objects) {
			was, is := b[s.name][object], n[s.name][object]
			fields := differing(was, is)
			if len(fields) == 0 {
				continue
			}
			c := Change{Decision: s.name, Object: object, Fields: fields}
			if c.Base, err = json.Marshal(was); err != nil {
				return nil, fmt.Errorf("compare %s %s: %w", s.name, object, err)
			}
			if c.New, err = json.Marshal(is); err != nil {
				return nil, fmt.Errorf("compare %s %s: %w", s.name, object, err)
			}
			changes = append(changes, c)
		}
	}
	errs, err := compareErrors(base.Errors, next.Errors)
	if err != nil {
		return nil, err
	}
	return append(changes, errs...), nil
}

// compareErrors is a change (decision "errors", field "errors") for every object whose errors
// differ between the two sides: in error under one bundle only, or for other reasons. Each
// side is {"errors": [...]}, that object's errors, or null when it has none.
func compareErrors(base, next []*manifest.Error) ([]Change, error) {
	byObject := func(errs []*manifest.Error) map[string][]*manifest.Error {
		out := map[string][]*manifest.Error{}
		for _, e := range errs {
			key := e.Object()
			if key == "" {
				key = e.Location
			}
			out[key] = append(out[key], e)
		}
		return out
	}
	b, n := byObject(base), byObject(next)
	objects := map[string]bool{}
	for k := range b {
		objects[k] = true
	}
	for k := range n {
		objects[k] = true
	}
	var changes []Change
	for _, object := range sortedKeys(objects) {
		if reflect.DeepEqual(b[object], n[object]) {
			continue
		}
		c := Change{Decision: "errors", Object: object, Fields: []string{"errors"}}
		side := func(errs []*manifest.Error) (json.RawMessage, error) {
			if len(errs) == 0 {
				return json.RawMessage("null"), nil
			}
			return json.Marshal(map[string]any{"errors": errs})
		}
		var err error
		if c.Base, err = side(b[object]); err != nil {
			return nil, fmt.Errorf("compare errors of %s: %w", object, err)
		}
		if c.New, err = side(n[object]); err != nil {
			return nil, fmt.Errorf("compare errors of %s: %w", object, err)
		}
		changes = append(changes, c)
	}
	return changes, nil
}

// bySection is the report as JSON values: section -> object key -> result.
func bySection(r *Report) (map[string]map[string]map[string]any, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("compare: encode report: %w", err)
	}
	var raw map[string][]map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("compare: decode report: %w", err)
	}
	out := map[string]map[string]map[string]any{}
	for _, s := range sections {
		out[s.name] = map[string]map[string]any{}
		for _, item := range raw[s.name] {
			key, _ := item[s.key].(string)
			out[s.name][key] = item
		}
	}
	return out, nil
}

// differing are the fields (but explanation) whose values differ, sorted; every field when a
// side is missing.
func differing(was, is map[string]any) []string {
	fields := map[string]bool{}
	for k := range was {
		fields[k] = true
	}
	for k := range is {
		fields[k] = true
	}
	var out []string
	for _, f := range sortedKeys(fields) {
		if f == "explanation" {
			continue
		}
		if was == nil || is == nil || !reflect.DeepEqual(was[f], is[f]) {
			out = append(out, f)
		}
	}
	return out
}

// CompareAnswers compares two answers of one decision for one object that is no section of
// the report (an admission webhook's answer, the defaulter's), as Compare compares a
// section's results: each answer is encoded as a JSON object, and the fields (but
// explanation) whose values differ are listed. It returns nil when they decide alike.
func CompareAnswers(decision, object string, base, next any) (*Change, error) {
	was, err := answerFields(base)
	if err != nil {
		return nil, fmt.Errorf("compare %s %s: %w", decision, object, err)
	}
	is, err := answerFields(next)
	if err != nil {
		return nil, fmt.Errorf("compare %s %s: %w", decision, object, err)
	}
	fields := differing(was, is)
	if len(fields) == 0 {
		return nil, nil
	}
	c := &Change{Decision: decision, Object: object, Fields: fields}
	if c.Base, err = json.Marshal(base); err != nil {
		return nil, fmt.Errorf("compare %s %s: %w", decision, object, err)
	}
	if c.New, err = json.Marshal(next); err != nil {
		return nil, fmt.Errorf("compare %s %s: %w", decision, object, err)
	}
	return c, nil
}

// answerFields is answer as a JSON object's fields.
func answerFields(answer any) (map[string]any, error) {
	data, err := json.Marshal(answer)
	if err != nil {
		return nil, fmt.Errorf("encode answer: %w", err)
	}
	var fields map[string]any
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, fmt.Errorf("answer %s: want a JSON object: %w", data, err)
	}
	return fields, nil
}
