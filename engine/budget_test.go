package engine_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/engine"
)

// decisionBody opens the body of the MigrationPolicy decision in policy.rego: the bundles
// below add their conditions first in it.
const decisionBody = "\"configuration\": _winner.configuration} if {\n"

// costlyDecision is issue 16's costly bundle: the MigrationPolicy decision first counts a
// comprehension over numbers.range(1, 100000000), about 10 GB of terms.
const costlyDecision = decisionBody + "\tcount([x | some x in numbers.range(1, 100000000)]) > 0\n"

func costly(t *testing.T) func(dir string) {
	return func(dir string) {
		replaceIn(t, filepath.Join(dir, policyModule), decisionBody, costlyDecision)
	}
}

// heapPeak runs f while sampling the heap every millisecond and returns by how much the
// heap's peak exceeded the heap before f (live objects and those not yet collected).
func heapPeak(f func()) int64 {
	runtime.GC()
	before := heapObjects()
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapObjects(); h > peak {
				peak = h
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	f()
	close(stop)
	wg.Wait()
	if h := heapObjects(); h > peak {
		peak = h
	}
	return int64(peak) - int64(before)
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestCostlyBundleIsRefusedFromAPath: the costly bundle of issue 16, which has no tests, is
// refused by its trial, naming the decision and the budget, with the heap bounded; the
// serving bundle keeps answering. The trial's time budget is raised from its default (2s) so
// that the memory budget, the one under test, stops it even on a loaded machine.
func TestCostlyBundleIsRefusedFromAPath(t *testing.T) {
	ctx := context.Background()
	var ev events
	e, err := engine.New(ctx, engine.WithBundleEvents(ev.record),
		engine.WithTrialBudget(engine.Budget{Timeout: time.Minute, Memory: engine.DefaultTrialBudget.Memory}))
	if err != nil {
		t.Fatal(err)
	}
	serving := e.Revision()
	dir := bundleDir(t, costly(t))
	start := time.Now()
	grew := heapPeak(func() { err = e.LoadPath(ctx, dir) })
	t.Logf("refused in %v, heap peak %d MiB over the heap before: %v", time.Since(start).Round(time.Millisecond), grew>>20, err)
	if !errors.Is(err, engine.ErrBudgetExceeded) || engine.RefusalReason(err) != engine.ReasonBudget {
		t.Fatalf("costly bundle: %v, want refused for its budget", err)
	}
	for _, s := range []string{"trial migration.policy", "evaluate migration.policy", "memory budget of 64 MiB"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal does not say %q: %v", s, err)
		}
	}
	if grew > 192<<20 {
		t.Errorf("the heap grew by %d MiB during the trial, over 3 times the 64 MiB budget", grew>>20)
	}
	if e.Revision() != serving || ev.last().Reason != engine.ReasonBudget {
		t.Errorf("serving %s, last event %+v; want %s still and a budget refusal", e.Revision(), ev.last(), serving)
	}
	if got := decidePolicy(t, e); got != "b-app" {
		t.Errorf("the serving bundle decided %q, want b-app", got)
	}

	// With no memory budget, the time budget alone refuses it.
	e2, err := engine.New(ctx, engine.WithTrialBudget(engine.Budget{Timeout: 300 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	err = e2.LoadPath(ctx, dir)
	var berr *engine.BudgetError
	if !errors.As(err, &berr) || berr.Budget != engine.BudgetTime || !strings.Contains(err.Error(), "time budget of 300ms") {
		t.Fatalf("with a time budget only: %v, want over the time budget", err)
	}
	if berr.Elapsed > 2*time.Second {
		t.Errorf("stopped after %v, want about 300ms", berr.Elapsed)
	}
}

// TestCostlyBundleIsRefusedFromAServer: from a bundle server, the costly bundle is refused
// by its trial with the heap bounded, and never persisted: the last good bundle keeps serving
// and stays the persisted one; with none, nothing is persisted and none serves.
func TestCostlyBundleIsRefusedFromAServer(t *testing.T) {
	ctx := context.Background()
	srv := newBundleServer(t)
	cache := t.TempDir()
	remote := engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second, CacheDir: cache}
	e, err := engine.New(ctx, engine.WithRemoteBundle(remote))
	if err != nil {
		t.Fatal(err)
	}
	good := buildBundle(t, bundleDir(t, kubevirtMode), "good-1", "")
	srv.serve(good)
	if err := e.UpdateBundle(ctx); err != nil {
		t.Fatal(err)
	}
	persisted := filepath.Join(cache, engine.CachedBundleFile)
	srv.serve(buildBundle(t, bundleDir(t, costly(t)), "costly-2", ""))
	grew := heapPeak(func() { err = e.UpdateBundle(ctx) })
	t.Logf("refused, heap peak %d MiB over the heap before: %v", grew>>20, err)
	if !errors.Is(err, engine.ErrBudgetExceeded) || engine.RefusalReason(err) != engine.ReasonBudget || !strings.Contains(err.Error(), "trial migration.policy") {
		t.Fatalf("costly bundle from a server: %v, want refused for its budget in the trial", err)
	}
	if grew > 192<<20 {
		t.Errorf("the heap grew by %d MiB, over 3 times the 64 MiB budget", grew>>20)
	}
	if e.Revision() != "good-1" || decidePolicy(t, e) != "a-zone" {
		t.Errorf("serving %s after the refusal, want good-1 answering a-zone", e.Revision())
	}
	if raw, err := os.ReadFile(persisted); err != nil || string(raw) != string(good) {
		t.Errorf("the persisted bundle is no longer good-1 (%d bytes, %v)", len(raw), err)
	}
	// Asked again, the server answers 304 for the refused bundle: it is not tried again.
	if err := e.UpdateBundle(ctx); err != nil || e.Revision() != "good-1" {
		t.Errorf("poll after the refusal: %v, revision %s", err, e.Revision())
	}

	// A first start with the costly bundle on the server: none serves, none is persisted.
	empty := t.TempDir()
	remote.CacheDir = empty
	first, err := engine.New(ctx, engine.WithRemoteBundle(remote))
	if err != nil {
		t.Fatal(err)
	}
	srv.serve(buildBundle(t, bundleDir(t, costly(t)), "costly-3", ""))
	if err := first.UpdateBundle(ctx); engine.RefusalReason(err) != engine.ReasonBudget {
		t.Fatalf("costly bundle on a first start: %v, want refused for its budget", err)
	}
	if first.Revision() != "" {
		t.Errorf("serving %q, want none", first.Revision())
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("the refused bundle left %d files in the cache dir, want none", len(entries))
	}
}

// TestSlowButFineBundleIsAccepted: a bundle whose decision does real work (a comprehension
// over 100,000 numbers: tens to hundreds of milliseconds, about 8 MiB) stays within the
// default trial budget.
func TestSlowButFineBundleIsAccepted(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slow := bundleDir(t, func(dir string) {
		replaceIn(t, filepath.Join(dir, policyModule), decisionBody, decisionBody+"\tcount([x | some x in numbers.range(1, 100000)]) > 0\n")
	})
	if err := e.LoadPath(ctx, slow); err != nil {
		t.Fatalf("slow but fine bundle refused: %v", err)
	}
	start := time.Now()
	if got := decidePolicy(t, e); got != "b-app" {
		t.Errorf("decided %q, want b-app", got)
	}
	t.Logf("one decision of the slow bundle: %v", time.Since(start))
	if e.Source() != slow {
		t.Errorf("serving %s, want the slow bundle", e.Source())
	}
}

// sneaky is a bundle that passes its trial but is costly live: its decision counts a
// comprehension over numbers.range(1, 100000000) for VMIs labelled costly=true, which no
// trial input is. Its precedence is KubeVirt's, so its answers are told apart.
func sneaky(t *testing.T) func(dir string) {
	return func(dir string) {
		kubevirtMode(dir)
		replaceIn(t, filepath.Join(dir, policyModule), decisionBody, decisionBody+"\t_affordable\n")
		f, err := os.OpenFile(filepath.Join(dir, policyModule), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(`
_affordable if not input.vmi.metadata.labels.costly

_affordable if count([x | some x in numbers.range(1, 100000000)]) > 0
`); err != nil {
			t.Fatal(err)
		}
	}
}

var costlyVMI = engine.MigrationPolicySubject{
	Namespace: "ns", Name: "costly", Labels: map[string]string{"app": "db", "zone": "z1", "costly": "true"},
	NamespaceLabels: map[string]string{"team": "x"},
}

type budgetEvents struct {
	mu  sync.Mutex
	all []*engine.BudgetError
}

func (b *budgetEvents) record(_ context.Context, e *engine.BudgetError) {
	b.mu.Lock()
	b.all = append(b.all, e)
	b.mu.Unlock()
}

func (b *budgetEvents) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.all)
}

// liveBudget is small, so that the sneaky bundle's costly decisions stop in a fraction of a
// second.
var liveBudget = engine.Budget{Timeout: 5 * time.Second, Memory: 32 << 20}

// TestBundleBreakingItsBudgetLiveIsReverted: the sneaky bundle passes its trial; after three
// live decisions over budget it is refused and the bundle before it restored.
func TestBundleBreakingItsBudgetLiveIsReverted(t *testing.T) {
	ctx := context.Background()
	var ev events
	var be budgetEvents
	e, err := engine.New(ctx, engine.WithBundleEvents(ev.record), engine.WithBudgetEvents(be.record),
		engine.WithDecisionBudget(liveBudget), engine.WithBundleRevert(3, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	embedded := e.Revision()
	dir := bundleDir(t, sneaky(t))
	if err := e.LoadPath(ctx, dir); err != nil {
		t.Fatalf("the sneaky bundle did not pass its trial: %v", err)
	}
	sneakyRevision := e.Revision()
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := set.Decide(ctx, tieVMI); err != nil || d.Policy != "a-zone" {
		t.Fatalf("the sneaky bundle decided %+v, %v; want a-zone", d, err)
	}
	for i := range 3 {
		start := time.Now()
		_, err := set.Decide(ctx, costlyVMI)
		var berr *engine.BudgetError
		// Memory, unless a loaded machine makes it slower than its time budget.
		if !errors.As(err, &berr) || berr.Decision != "migration.policy" {
			t.Fatalf("costly decision %d: %v, want over its budget", i+1, err)
		}
		t.Logf("costly decision %d stopped after %v: %v", i+1, time.Since(start).Round(time.Millisecond), err)
	}
	waitFor(t, 10*time.Second, "the revert", func() bool { return e.Revision() == embedded })
	if d, err := set.Decide(ctx, tieVMI); err != nil || d.Policy != "b-app" || d.Revision != embedded {
		t.Errorf("after the revert: %+v, %v; want the embedded bundle's b-app", d, err)
	}
	if be.count() != 3 {
		t.Errorf("%d budget events, want 3", be.count())
	}
	ev.mu.Lock()
	all := ev.all
	ev.mu.Unlock()
	refusal, restore := all[len(all)-2], all[len(all)-1]
	if refusal.Reason != engine.ReasonBudget || refusal.RefusedRevision != sneakyRevision || !strings.Contains(refusal.Err.Error(), "3 decisions broke their budget within 1m0s") {
		t.Errorf("refusal event %+v", refusal)
	}
	if !restore.Restored || restore.Revision != embedded || restore.PreviousRevision != sneakyRevision {
		t.Errorf("restore event %+v", restore)
	}
	// Nothing left to restore: the embedded bundle keeps serving whatever happens.
	if _, err := set.Decide(ctx, costlyVMI); err != nil {
		t.Errorf("the embedded bundle on the costly VMI: %v", err)
	}
}

// TestRemoteBundleBreakingItsBudgetLiveIsNotKeptPersisted: from a server, the restored
// bundle is the persisted last good one again, and the refused one is not downloaded again.
func TestRemoteBundleBreakingItsBudgetLiveIsNotKeptPersisted(t *testing.T) {
	ctx := context.Background()
	srv := newBundleServer(t)
	cache := t.TempDir()
	remote := engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second, CacheDir: cache}
	e, err := engine.New(ctx, engine.WithRemoteBundle(remote), engine.WithDecisionBudget(liveBudget), engine.WithBundleRevert(2, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	good := buildBundle(t, bundleDir(t, nil), "good-1", "")
	srv.serve(good)
	if err := e.UpdateBundle(ctx); err != nil {
		t.Fatal(err)
	}
	srv.serve(buildBundle(t, bundleDir(t, sneaky(t)), "sneaky-2", ""))
	if err := e.UpdateBundle(ctx); err != nil || e.Revision() != "sneaky-2" {
		t.Fatalf("the sneaky bundle: %v, revision %s", err, e.Revision())
	}
	persisted := filepath.Join(cache, engine.CachedBundleFile)
	if raw, err := os.ReadFile(persisted); err != nil || string(raw) != string(good) {
		t.Errorf("sneaky-2 serving on probation: the persisted bundle is not good-1 (%d bytes, %v)", len(raw), err)
	}
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := set.Decide(ctx, costlyVMI); !errors.Is(err, engine.ErrBudgetExceeded) {
			t.Fatalf("costly decision: %v, want over budget", err)
		}
	}
	waitFor(t, 10*time.Second, "the revert", func() bool { return e.Revision() == "good-1" })
	waitFor(t, 5*time.Second, "good-1 persisted again", func() bool {
		raw, err := os.ReadFile(persisted)
		return err == nil && string(raw) == string(good)
	})
	if err := e.UpdateBundle(ctx); err != nil || e.Revision() != "good-1" {
		t.Errorf("poll after the revert: %v, revision %s; want good-1 kept (the server still serves sneaky-2)", err, e.Revision())
	}
	// A restart starts from good-1 and, the server still serving sneaky-2, keeps it.
	restarted, err := engine.New(ctx, engine.WithRemoteBundle(remote))
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.UpdateBundle(ctx); err != nil || restarted.Revision() != "good-1" {
		t.Errorf("restarted: %v, revision %q; want good-1", err, restarted.Revision())
	}
	// A new bundle on the server is downloaded as usual.
	srv.serve(buildBundle(t, bundleDir(t, nil), "good-3", ""))
	if err := restarted.UpdateBundle(ctx); err != nil || restarted.Revision() != "good-3" {
		t.Errorf("a new bundle after the revert: %v, revision %q; want good-3", err, restarted.Revision())
	}
}

// TestRemoteBundleIsPersistedAfterItsProbation: a bundle from a server that replaced another
// is persisted as the last good one only at the first poll after it has served a whole revert
// window within budget; a broken budget within the window starts the window again. A restart
// in the meantime starts from the bundle before it.
func TestRemoteBundleIsPersistedAfterItsProbation(t *testing.T) {
	ctx := context.Background()
	srv := newBundleServer(t)
	cache := t.TempDir()
	remote := engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second, CacheDir: cache}
	const window = 1500 * time.Millisecond
	e, err := engine.New(ctx, engine.WithRemoteBundle(remote), engine.WithDecisionBudget(liveBudget), engine.WithBundleRevert(3, window))
	if err != nil {
		t.Fatal(err)
	}
	persisted := func() string {
		raw, _ := os.ReadFile(filepath.Join(cache, engine.CachedBundleFile))
		return string(raw)
	}
	good := buildBundle(t, bundleDir(t, nil), "good-1", "")
	srv.serve(good)
	if err := e.UpdateBundle(ctx); err != nil {
		t.Fatal(err)
	}
	if persisted() != string(good) {
		t.Fatal("the first bundle, with nothing to restore instead, is not persisted at once")
	}

	sneaky2 := buildBundle(t, bundleDir(t, sneaky(t)), "sneaky-2", "")
	srv.serve(sneaky2)
	activated := time.Now()
	if err := e.UpdateBundle(ctx); err != nil || e.Revision() != "sneaky-2" {
		t.Fatalf("sneaky-2: %v, revision %s", err, e.Revision())
	}
	// Polls within the window keep good-1 persisted; a restart now starts from good-1.
	if err := e.UpdateBundle(ctx); err != nil || persisted() != string(good) {
		t.Fatalf("a poll within the probation: %v; persisted is good-1: %v", err, persisted() == string(good))
	}
	restarted, err := engine.New(ctx, engine.WithRemoteBundle(engine.RemoteBundle{AllowHTTP: true, URL: srv.url(),
		MinDelay: time.Second, MaxDelay: time.Second, CacheDir: cache}))
	if err != nil || restarted.Revision() != "good-1" {
		t.Fatalf("a restart during the probation: %v, revision %q; want good-1", err, restarted.Revision())
	}

	// One broken budget within the window (under the 3 that revert): the probation restarts.
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Decide(ctx, costlyVMI); !errors.Is(err, engine.ErrBudgetExceeded) {
		t.Fatalf("costly decision: %v, want over budget", err)
	}
	time.Sleep(time.Until(activated.Add(window + 100*time.Millisecond)))
	if err := e.UpdateBundle(ctx); err != nil || persisted() != string(good) {
		t.Fatalf("the first poll after a window with a broken budget: %v; persisted is good-1: %v, want still good-1",
			err, persisted() == string(good))
	}
	// A whole window without a broken budget: the next poll persists sneaky-2.
	time.Sleep(window + 100*time.Millisecond)
	if err := e.UpdateBundle(ctx); err != nil || persisted() != string(sneaky2) {
		t.Fatalf("the first poll after a clean window: %v; persisted is sneaky-2: %v", err, persisted() == string(sneaky2))
	}
	if e.Revision() != "sneaky-2" {
		t.Errorf("revision %s after the probation, want sneaky-2", e.Revision())
	}
}

// TestDecisionBudgets: a live decision over its time budget or its memory budget stops with a
// *BudgetError naming the decision and the budget; a caller's cancelled context is not a
// broken budget.
func TestDecisionBudgets(t *testing.T) {
	ctx := context.Background()
	dir := bundleDir(t, sneaky(t))
	for _, tc := range []struct {
		budget engine.Budget
		want   string
		text   string
	}{
		{engine.Budget{Timeout: 200 * time.Millisecond}, engine.BudgetTime, "over the time budget of 200ms"},
		{engine.Budget{Memory: 16 << 20}, engine.BudgetMemory, "over the memory budget of 16 MiB"},
	} {
		e, err := engine.New(ctx, engine.WithBundlePath(dir), engine.WithDecisionBudget(tc.budget), engine.WithBundleRevert(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		set, err := e.MigrationPolicies(tiePolicies(), nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = set.Decide(ctx, costlyVMI)
		var berr *engine.BudgetError
		if !errors.As(err, &berr) || berr.Budget != tc.want || !strings.Contains(err.Error(), tc.text) ||
			!strings.Contains(err.Error(), "evaluate migration.policy (bundle ") {
			t.Fatalf("budget %+v: %v, want over the %s budget", tc.budget, err, tc.want)
		}
		t.Logf("budget %+v: stopped after %v: %v", tc.budget, time.Since(start).Round(time.Millisecond), err)
		if d, err := set.Decide(ctx, tieVMI); err != nil || d.Policy != "a-zone" {
			t.Errorf("a cheap decision after it: %+v, %v", d, err)
		}
	}
	e, err := engine.New(ctx, engine.WithBundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err = set.Decide(cctx, costlyVMI); err == nil || errors.Is(err, engine.ErrBudgetExceeded) {
		t.Errorf("a cancelled context: %v, want an error that is not a broken budget", err)
	}
}

// TestUndecidingBundleIsRefused: a bundle with no tests whose decision cannot decide the
// trial's input (an evaluation error) is refused by the trial, naming decision and input.
func TestUndecidingBundleIsRefused(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := bundleDir(t, func(dir string) {
		replaceIn(t, filepath.Join(dir, policyModule), decisionBody, decisionBody+"\t_conflict > 0\n")
		f, err := os.OpenFile(filepath.Join(dir, policyModule), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.WriteString("\n_conflict := 1 if input.vmi\n\n_conflict := 2 if input.vmi\n")
	})
	err = e.LoadPath(ctx, dir)
	if engine.RefusalReason(err) != engine.ReasonTrial || errors.Is(err, engine.ErrBudgetExceeded) ||
		!strings.Contains(err.Error(), "trial migration.policy on VMI hpc/fedora-gpu of examples/migration-policy") ||
		!strings.Contains(err.Error(), "eval_conflict_error") {
		t.Fatalf("%v, want refused by the trial for its conflict", err)
	}
	if e.Source() != engine.SourceEmbedded {
		t.Errorf("serving %s, want the embedded bundle still", e.Source())
	}
}
