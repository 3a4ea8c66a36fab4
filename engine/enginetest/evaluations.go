// Package enginetest holds what tests of the engine's callers share about the engine.
package enginetest

import (
	"context"
	"sync"

	"github.com/virt-rules/virt-rules/engine"
)

// Evaluations is a decision logger (engine.WithDecisionLogger) counting the engine's
// evaluations by entrypoint name, for tests that show work is not done twice.
type Evaluations struct {
	mu     sync.Mutex
	byName map[string]int
}

// LogDecision counts d under its name.
func (c *Evaluations) LogDecision(_ context.Context, d *engine.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byName == nil {
		c.byName = map[string]int{}
	}
	c.byName[d.Name]++
}

// Take returns the counts since the last Take and starts again from zero.
func (c *Evaluations) Take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.byName
	c.byName = map[string]int{}
	return out
}
