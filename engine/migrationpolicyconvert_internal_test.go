package engine

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// A set takes the last set's conversion of each policy of the same name, UID and
// resourceVersion, and converts the others: a new version, another UID, a policy without
// both (as given to eval). Decisions follow the new version.
func TestMigrationPoliciesConvertOnlyNewVersions(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	policy := func(name, uid, version, app string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
			"metadata": map[string]any{"name": name},
			"spec": map[string]any{
				"selectors":             map[string]any{"virtualMachineInstanceSelector": map[string]any{"app": app}},
				"bandwidthPerMigration": "1Gi",
			},
		}}
		u.SetUID(types.UID(uid))
		u.SetResourceVersion(version)
		return u
	}
	first, err := e.MigrationPolicies([]*unstructured.Unstructured{
		policy("same", "u1", "1", "a"),
		policy("changed", "u2", "1", "b"),
		policy("recreated", "u3", "1", "c"),
		policy("from-a-file", "", "", "d"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.MigrationPolicies([]*unstructured.Unstructured{
		policy("same", "u1", "1", "a"),
		policy("changed", "u2", "2", "x"),
		policy("recreated", "u4", "1", "c"),
		policy("from-a-file", "", "", "d"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false, false} {
		if got := first.terms[i] == second.terms[i]; got != want {
			t.Errorf("policy %s: conversion taken from the last set %v, want %v", second.names[i], got, want)
		}
	}
	d, err := second.Decide(ctx, MigrationPolicySubject{Namespace: "ns", Name: "vmi", Labels: map[string]string{"app": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Policy != "changed" {
		t.Errorf("a VMI labelled app=x obeys %q, want the changed policy's new version", d.Policy)
	}
}
