package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestRemoveWebhookConfigurationsDeletesOnlyTheNamedAndSkipsAbsentOnes(t *testing.T) {
	cs := fake.NewClientset(
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-validating"}},
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-mutating"}},
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}},
	)
	refs, err := parseWebhookConfigurations(defaultWebhookConfigurations)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for run := 1; run <= 2; run++ { // the second run finds all absent
		if err := removeWebhookConfigurations(ctx, cs, refs, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
	}
	vs, _ := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	ms, _ := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if len(vs.Items) != 0 || len(ms.Items) != 1 || ms.Items[0].Name != "someone-elses" {
		t.Fatalf("left %d validating and %v mutating; want only mutating someone-elses", len(vs.Items), ms.Items)
	}
}

func TestRemoveWebhookConfigurationsTriesEachAndNamesEveryFailure(t *testing.T) {
	cs := fake.NewClientset(&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-mutating"}})
	cs.PrependReactor("delete", "validatingwebhookconfigurations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"}, "virt-rules-validating", nil)
	})
	refs, _ := parseWebhookConfigurations([]string{"validating/virt-rules-validating", "mutating/virt-rules-mutating"})
	err := removeWebhookConfigurations(context.Background(), cs, refs, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "delete validating webhook configuration virt-rules-validating: ") || !apierrors.IsForbidden(err) {
		t.Fatalf("err = %v, want the forbidden delete named", err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "virt-rules-mutating", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("virt-rules-mutating: %v, want deleted after the validating one failed", err)
	}
}

func TestParseWebhookConfigurationsRefusesOtherKinds(t *testing.T) {
	for _, bad := range []string{"virt-rules-validating", "crd/x", "mutating/", "validating/a/b"} {
		if _, err := parseWebhookConfigurations([]string{bad}); err == nil || !strings.Contains(err.Error(), "want validating/NAME or mutating/NAME") {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}
