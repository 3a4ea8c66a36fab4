package engine

import (
	"bytes"
	"context"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

type namesLogger struct {
	mu    sync.Mutex
	names map[string]int
}

func (l *namesLogger) LogDecision(_ context.Context, d *Decision) {
	l.mu.Lock()
	l.names[d.Name]++
	l.mu.Unlock()
}

// TestTrialEvaluatesEveryEntrypoint: the trial's decisions evaluate every entrypoint a
// bundle serves, optional ones included, so no rule of a decision escapes the trial.
func TestTrialEvaluatesEveryEntrypoint(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in, err := loadTrialInputs()
	if err != nil {
		t.Fatal(err)
	}
	candidate := *e.active.Load()
	log := &namesLogger{names: map[string]int{}}
	candidate.decisions = log
	shadow := &Engine{log: e.log}
	shadow.active.Store(&candidate)
	for _, c := range trialCases {
		if err := c.run(ctx, shadow, in); err != nil {
			t.Errorf("trial %s on %s: %v", c.decision, c.input, err)
		}
	}
	for _, entry := range slices.Sorted(maps.Keys(entrypoints)) {
		if log.names[entry] == 0 {
			t.Errorf("the trial does not evaluate %s", entry)
		}
	}
	for _, entry := range slices.Sorted(maps.Keys(optionalEntrypoints)) {
		if log.names[entry] == 0 {
			t.Errorf("the trial does not evaluate the optional %s", entry)
		}
	}
	t.Logf("trial decisions %v evaluate %v", trialDecisions(), log.names)
}

// TestTrialInputsAreTheExamples: testdata/trial holds the manifests of examples/, byte for
// byte, every one of the example directories it copies. Refresh with
//
//	for d in cpu-baseline drain migration-policy migration-target migratability pool; do cp examples/$d/*.yaml engine/testdata/trial/$d/; done
func TestTrialInputsAreTheExamples(t *testing.T) {
	dirs, err := os.ReadDir("testdata/trial")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 6 {
		t.Errorf("%d example directories in testdata/trial, want 6", len(dirs))
	}
	for _, d := range dirs {
		example, err := filepath.Glob(filepath.Join("..", "examples", d.Name(), "*.yaml"))
		if err != nil || len(example) == 0 {
			t.Errorf("examples/%s: no manifests (%v)", d.Name(), err)
			continue
		}
		copied := map[string]bool{}
		err = fs.WalkDir(os.DirFS("testdata/trial"), d.Name(), func(p string, entry fs.DirEntry, err error) error {
			if err == nil && !entry.IsDir() {
				copied[filepath.Base(p)] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range example {
			want, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join("testdata/trial", d.Name(), filepath.Base(src)))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("testdata/trial/%s/%s is not %s (%v): copy it again", d.Name(), filepath.Base(src), src, err)
			}
			delete(copied, filepath.Base(src))
		}
		for name := range copied {
			if !strings.HasSuffix(name, ".yaml") {
				continue
			}
			t.Errorf("testdata/trial/%s/%s is in no example", d.Name(), name)
		}
	}
}
