package bundlestatus_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlestatus"
	virtrego "github.com/virt-rules/virt-rules/rego"
)

func bundleWithPrecedence(t *testing.T, precedence string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "virtrules/migration/policy/data.json")
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.Replace(string(b), `"precedence": "default"`, `"precedence": "`+precedence+`"`, 1))
	if err := os.WriteFile(data, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Drop the shipped tests: they pin the shipped settings.
	filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "_test.rego") {
			os.Remove(p)
		}
		return err
	})
	return dir
}

func TestMetricsAndEventsFollowTheEngine(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s, err := bundlestatus.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, "virtrules_bundle_seconds_since_last_activation"); v != -1 {
		t.Errorf("seconds since last activation before any: %v, want -1", v)
	}
	e, err := engine.New(ctx, engine.WithBundleEvents(s.Observe))
	if err != nil {
		t.Fatal(err)
	}
	embedded := e.Revision()
	rec := record.NewFakeRecorder(10)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-0", Namespace: "virt-rules"}}
	s.RecordEventsOn(rec, pod)
	expectEvent(t, rec, "Normal BundleActivated Bundle revision "+embedded+" from embedded activated")

	kubevirt := bundleWithPrecedence(t, "kubevirt")
	if err := e.LoadPath(ctx, kubevirt); err != nil {
		t.Fatal(err)
	}
	swapped := e.Revision()
	expectEvent(t, rec, "Normal BundleActivated Bundle revision "+swapped+" from "+kubevirt+" activated, replacing revision "+embedded)

	if err := e.LoadPath(ctx, bundleWithPrecedence(t, "fastest")); err == nil {
		t.Fatal("invalid settings accepted")
	}
	expectEvent(t, rec, "Warning BundleRefused Bundle from")
	if err := e.LoadPath(ctx, filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing bundle accepted")
	}
	expectEvent(t, rec, "Warning BundleRefused")

	want := `
# HELP virtrules_bundle_active_revision 1 for the revision of the Rego bundle serving decisions, labelled with where it came from.
# TYPE virtrules_bundle_active_revision gauge
virtrules_bundle_active_revision{revision="` + swapped + `",source="` + kubevirt + `"} 1
# HELP virtrules_bundle_load_failures_total Rego bundles not activated (the previous one kept serving), by reason: download, signature, read, compile, decisions, settings, test, prepare, persist.
# TYPE virtrules_bundle_load_failures_total counter
virtrules_bundle_load_failures_total{reason="read"} 1
virtrules_bundle_load_failures_total{reason="settings"} 1
# HELP virtrules_bundle_load_successes_total Rego bundles activated.
# TYPE virtrules_bundle_load_successes_total counter
virtrules_bundle_load_successes_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"virtrules_bundle_active_revision", "virtrules_bundle_load_failures_total", "virtrules_bundle_load_successes_total"); err != nil {
		t.Error(err)
	}
	since := gauge(t, reg, "virtrules_bundle_seconds_since_last_activation")
	if since < 0 || since > 60 {
		t.Errorf("seconds since last activation %v", since)
	}
	if ts := gauge(t, reg, "virtrules_bundle_last_activation_timestamp_seconds"); ts < 1e9 {
		t.Errorf("last activation timestamp %v", ts)
	}
}

func expectEvent(t *testing.T, rec *record.FakeRecorder, prefix string) {
	t.Helper()
	select {
	case got := <-rec.Events:
		if !strings.HasPrefix(got, prefix) {
			t.Errorf("event %q, want %q...", got, prefix)
		}
	default:
		t.Errorf("no event, want %q...", prefix)
	}
}

// gauge is the value of the registered gauge name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
