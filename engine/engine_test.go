package engine_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	virtrego "github.com/virt-rules/virt-rules/rego"
)

const policyModule = "virtrules/migration/policy/policy.rego"

// bundleDir copies the embedded bundle source, without its tests, to a temp dir and applies
// edit to it.
func bundleDir(t *testing.T, edit func(dir string)) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	// Without the shipped tests, as `opa build --ignore '*_test.rego'` builds a bundle: they
	// assume the shipped settings, which several tests here change.
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "_test.rego") {
			return os.Remove(p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(dir)
	}
	return dir
}

func replaceIn(t *testing.T, file, old, new string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s does not contain %q", file, old)
	}
	// Write and rename, as an admin replacing a bundle file should: a watcher polling
	// meanwhile must never read a half-written file.
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func policy(name string, vmi map[string]string) *unstructured.Unstructured {
	sel := map[string]any{}
	for k, v := range vmi {
		sel[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "migrations.kubevirt.io/v1alpha1",
		"kind":       "MigrationPolicy",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"selectors": map[string]any{"virtualMachineInstanceSelector": sel}},
	}}
}

// tiePolicies make the two precedence modes disagree: both match 2 labels with 1 VMI label,
// "b-..." has the smaller key list (default mode), "a-..." the smaller name (kubevirt mode).
func tiePolicies() []*unstructured.Unstructured {
	a := policy("a-zone", map[string]string{"zone": "z1"})
	unstructured.SetNestedStringMap(a.Object, map[string]string{"team": "x"}, "spec", "selectors", "namespaceSelector")
	b := policy("b-app", map[string]string{"app": "db"})
	unstructured.SetNestedStringMap(b.Object, map[string]string{"team": "x"}, "spec", "selectors", "namespaceSelector")
	return []*unstructured.Unstructured{a, b}
}

var tieVMI = engine.MigrationPolicySubject{
	Namespace: "ns", Name: "vm", Labels: map[string]string{"app": "db", "zone": "z1"},
	NamespaceLabels: map[string]string{"team": "x"},
}

func decidePolicy(t *testing.T, e *engine.Engine) string {
	t.Helper()
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := set.Decide(context.Background(), tieVMI)
	if err != nil {
		t.Fatal(err)
	}
	return d.Policy
}

func kubevirtMode(dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "virtrules/migration/policy/data.json"))
	os.WriteFile(filepath.Join(dir, "virtrules/migration/policy/data.json"),
		[]byte(strings.Replace(string(b), `"precedence": "default"`, `"precedence": "kubevirt"`, 1)), 0o644)
}

func TestEmbeddedBundleServes(t *testing.T) {
	e, err := engine.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if e.Source() != engine.SourceEmbedded || !strings.HasPrefix(e.Revision(), "sha256:") {
		t.Errorf("source %q revision %q, want embedded with a content digest", e.Source(), e.Revision())
	}
	if got := decidePolicy(t, e); got != "b-app" {
		t.Errorf("default precedence chose %q, want b-app (smaller key list)", got)
	}
}

// TestShippedTestsPassInTheEngine loads rego/ with its tests, as a bundle an admin ships:
// the engine runs them the way `opa test` does, so both must agree.
func TestShippedTestsPassInTheEngine(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.CopyFS(dir, virtrego.Bundle()); err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(ctx, engine.WithBundlePath(dir))
	if err != nil {
		t.Fatalf("shipped bundle with its tests refused: %v", err)
	}
	if got := decidePolicy(t, e); got != "b-app" {
		t.Errorf("chose %q, want b-app", got)
	}
}

func TestPrecedenceModeIsBundleData(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.WithBundlePath(bundleDir(t, kubevirtMode)))
	if err != nil {
		t.Fatal(err)
	}
	if got := decidePolicy(t, e); got != "a-zone" {
		t.Errorf("kubevirt precedence chose %q, want a-zone (name order)", got)
	}
}

// TestBadBundlesAreRefused feeds bundles that must not replace the serving one; each is
// refused with a message naming what is wrong and where, and the old bundle keeps answering.
func TestBadBundlesAreRefused(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	serving := e.Revision()
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		edit   func(t *testing.T, dir string)
		is     error
		inText []string
	}{{
		name: "syntax error",
		edit: func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, policyModule), "_scopes := [", "_scopes := [[")
		},
		is:     engine.ErrBundleRefused,
		inText: []string{"policy.rego:", "rego_parse_error"},
	}, {
		name: "strict check",
		edit: func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, policyModule), "_scope_name := {", "_unused(x) := 1\n\n_scope_name := {")
		},
		is:     engine.ErrBundleRefused,
		inText: []string{"policy.rego:", "unused argument x"},
	}, {
		name: "failing rego test",
		edit: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "virtrules/migration/policy/broken_test.rego"),
				"package virtrules.migration.policy_test\n\ntest_no_policy_wins if {\n\tdata.virtrules.migration.policy.decision.policy == \"nope\" with input as {\"vmi\": {}, \"policies\": []}\n}\n")
		},
		is:     engine.ErrBundleTestsFailed,
		inText: []string{"broken_test.rego:3", "test_no_policy_wins", "1 failed"},
	}, {
		name: "missing decision",
		edit: func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, policyModule), "\ndecision := {", "\nverdict := {")
		},
		is:     engine.ErrMissingDecision,
		inText: []string{`no rule "decision" in package virtrules.migration.policy`},
	}, {
		name: "invalid settings",
		edit: func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, "virtrules/migration/policy/data.json"), `"precedence": "default"`, `"precedence": "fastest"`)
		},
		is:     engine.ErrBundleRefused,
		inText: []string{"settings.precedence", "fastest"},
	}, {
		name:   "missing path",
		edit:   func(t *testing.T, dir string) { os.RemoveAll(dir) },
		is:     engine.ErrBundleRefused,
		inText: []string{"no such file"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := bundleDir(t, nil)
			tc.edit(t, dir)
			err := e.LoadPath(ctx, dir)
			if err == nil {
				t.Fatal("bundle was accepted")
			}
			if !errors.Is(err, tc.is) || !errors.Is(err, engine.ErrBundleRefused) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			for _, s := range tc.inText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not mention %q:\n%v", s, err)
				}
			}
			if e.Revision() != serving {
				t.Errorf("revision changed to %s after a refused bundle", e.Revision())
			}
			d, err := set.Decide(ctx, tieVMI)
			if err != nil || d.Policy != "b-app" || d.Revision != serving {
				t.Errorf("old bundle no longer answers: %+v, %v", d, err)
			}
		})
	}
}

func TestLoadTarball(t *testing.T) {
	ctx := context.Background()
	dir := bundleDir(t, kubevirtMode)
	tarball := filepath.Join(t.TempDir(), "bundle.tar.gz")
	writeTarball(t, dir, tarball)
	e, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.LoadPath(ctx, tarball); err != nil {
		t.Fatal(err)
	}
	if e.Source() != tarball {
		t.Errorf("source %q, want %q", e.Source(), tarball)
	}
	if got := decidePolicy(t, e); got != "a-zone" {
		t.Errorf("tarball bundle chose %q, want a-zone", got)
	}
}

// writeTarball packs dir the way `opa build` lays out a bundle (paths rooted at /).
func writeTarball(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if err := tw.WriteHeader(&tar.Header{Name: "/" + rel, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSwapUnderConcurrentEvaluation swaps between two bundles that decide differently while
// goroutines decide; every decision must match the one revision it reports.
func TestSwapUnderConcurrentEvaluation(t *testing.T) {
	ctx := context.Background()
	defaultDir, kubevirtDir := bundleDir(t, nil), bundleDir(t, kubevirtMode)
	e, err := engine.New(ctx, engine.WithBundlePath(defaultDir))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{e.Revision(): "b-app"}
	if err := e.LoadPath(ctx, kubevirtDir); err != nil {
		t.Fatal(err)
	}
	want[e.Revision()] = "a-zone"
	if len(want) != 2 {
		t.Fatal("the two bundles have the same revision")
	}
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	counts := make([]int, 4)
	for w := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := set.Decide(ctx, tieVMI)
				if err != nil {
					errs <- err
					return
				}
				if want[d.Revision] != d.Policy {
					errs <- errors.New("revision " + d.Revision + " decided " + d.Policy + ", want " + want[d.Revision])
					return
				}
				counts[w]++
			}
		})
	}
	for i := range 20 {
		dir := defaultDir
		if i%2 == 1 {
			dir = kubevirtDir
		}
		if err := e.LoadPath(ctx, dir); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	t.Logf("%d decisions across 20 swaps", total)
	if total == 0 {
		t.Error("no decisions were made during the swaps")
	}
}

func TestWatchBundleReloadsOnChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := bundleDir(t, nil)
	e, err := engine.New(ctx, engine.WithBundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	loads := make(chan error, 4)
	go e.WatchBundle(ctx, dir, 20*time.Millisecond, func(err error) { loads <- err })

	replaceIn(t, filepath.Join(dir, "virtrules/migration/policy/data.json"), `"precedence": "default"`, `"precedence": "broken"`)
	if err := waitLoad(t, loads); err == nil || !strings.Contains(err.Error(), "settings.precedence") {
		t.Fatalf("broken change: got %v, want a refusal naming settings.precedence", err)
	}
	if got := decidePolicy(t, e); got != "b-app" {
		t.Errorf("after a refused change the engine decides %q, want the old b-app", got)
	}
	replaceIn(t, filepath.Join(dir, "virtrules/migration/policy/data.json"), `"precedence": "broken"`, `"precedence": "kubevirt"`)
	if err := waitLoad(t, loads); err != nil {
		t.Fatalf("good change refused: %v", err)
	}
	if got := decidePolicy(t, e); got != "a-zone" {
		t.Errorf("after reload the engine decides %q, want a-zone", got)
	}
	// A file the bundle loader does not read (an editor's swap file) is no reason to reload.
	if err := os.WriteFile(filepath.Join(dir, "virtrules", ".data.json.swp"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-loads:
		t.Errorf("reloaded (%v) for a file that is not part of the bundle", err)
	case <-time.After(300 * time.Millisecond):
	}
}

func waitLoad(t *testing.T, loads <-chan error) error {
	t.Helper()
	select {
	case err := <-loads:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s")
		return nil
	}
}
