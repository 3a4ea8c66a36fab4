package engine

import (
	"context"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Decision is one evaluated decision, as the decision log sees it.
type Decision struct {
	// Name is the decision's entrypoint name, such as migration.policy.
	Name string
	// Query is the Rego query evaluated, such as data.virtrules.migration.policy.decision.
	Query string
	// Revision is the revision of the bundle that decided.
	Revision string
	// Input is what the decision read. It is shared with the engine: read it, never change it.
	Input ast.Value
	// Result is the decision's value, nil when Err is set.
	Result *ast.Term
	Err    error
	// Timestamp is when evaluation started; Duration how long it took.
	Timestamp time.Time
	Duration  time.Duration
}

// DecisionLogger receives every decision the engine evaluates, in the evaluating goroutine,
// after the evaluation. It must be safe for concurrent use and should return quickly.
type DecisionLogger interface {
	LogDecision(ctx context.Context, d *Decision)
}
