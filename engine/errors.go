package engine

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Callers match them with errors.Is; the wrapped message says which file,
// line, decision or object is at fault.
var (
	// ErrBundleRefused wraps every reason a bundle is not activated: it does not load or
	// compile, fails the strict check, fails its own tests, lacks a decision, has invalid
	// settings, or fails its trial. The engine keeps serving the previous bundle. It also
	// wraps the refusal of a serving bundle whose decisions broke their budget too often
	// (WithBundleRevert), after which the previous bundle serves again.
	ErrBundleRefused = errors.New("bundle refused")
	// ErrMissingDecision is wrapped in ErrBundleRefused when a bundle lacks an entrypoint the
	// engine serves.
	ErrMissingDecision = errors.New("missing decision")
	// ErrBundleTestsFailed is wrapped in ErrBundleRefused when a bundle's own tests fail.
	ErrBundleTestsFailed = errors.New("bundle tests failed")
	// ErrUndefined means a decision produced no value for an input, which a correct bundle
	// never does: it is reported, never replaced by a default.
	ErrUndefined = errors.New("decision undefined")
	// ErrMalformedInput means an object given to a decision cannot be decided on, such as a
	// MigrationPolicy whose selectors have the wrong shape.
	ErrMalformedInput = errors.New("malformed input")
	// ErrNoBundle means no bundle is active yet: the engine polls a bundle server and has
	// neither downloaded a bundle nor found a persisted one. Decisions fail until one is.
	ErrNoBundle = errors.New("no bundle active")
	// ErrBudgetExceeded means an evaluation was stopped for breaking its budget: it ran
	// longer than its time budget, or the heap grew by more than its memory budget while it
	// ran (see Budget). The error is a *BudgetError naming the decision and the budget.
	ErrBudgetExceeded = errors.New("decision over budget")
	// ErrBundleTooLarge is wrapped in ErrBundleRefused when a bundle's files add up to more
	// than the bundle size limit once decompressed (WithBundleSizeLimit).
	ErrBundleTooLarge = errors.New("bundle too large")
)

// Reasons a bundle is refused, as BundleError.Reason and the metrics' reason label.
const (
	ReasonDownload  = "download"  // the bundle server did not answer with a bundle
	ReasonSignature = "signature" // unsigned, signed by another key, or tampered with
	ReasonRead      = "read"      // not a readable bundle (archive, syntax, data files)
	ReasonCompile   = "compile"   // compile or strict check failed
	ReasonDecisions = "decisions" // a decision the engine serves is missing
	ReasonSettings  = "settings"  // the bundle's settings (data) are invalid
	ReasonTest      = "test"      // the bundle's own Rego tests failed
	ReasonPrepare   = "prepare"   // a decision could not be prepared
	ReasonPersist   = "persist"   // activated, but the copy on disk could not be written
	ReasonTrial     = "trial"     // a decision failed on a representative input (trial.go)
	ReasonBudget    = "budget"    // a decision broke its budget: in the trial, or live (then the previous bundle is restored)
)

// BundleError is a refused bundle: where it came from, the step that refused it and why.
// It matches ErrBundleRefused and the cause.
type BundleError struct {
	Source string
	Reason string // one of the Reason constants
	Step   string // the step in words, such as "check settings"
	Err    error
}

func (e *BundleError) Error() string {
	return fmt.Sprintf("%v: %s: %s: %v", ErrBundleRefused, e.Source, e.Step, e.Err)
}

// Unwrap makes errors.Is match both ErrBundleRefused and the cause.
func (e *BundleError) Unwrap() []error { return []error{ErrBundleRefused, e.Err} }

// RefusalReason is the Reason of a BundleError in err's chain, "" when there is none.
func RefusalReason(err error) string {
	var be *BundleError
	if errors.As(err, &be) {
		return be.Reason
	}
	return ""
}

// FieldError is malformed input at one field of an object; it matches ErrMalformedInput.
type FieldError struct {
	Field   string // a path such as spec.configuration.migrations.requireHostModelMigratabilityLevel
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Unwrap makes errors.Is(err, ErrMalformedInput) hold.
func (e *FieldError) Unwrap() error { return ErrMalformedInput }

// fieldError reads a decision's "<field path>: <message>" text.
func fieldError(text string) *FieldError {
	field, msg, ok := strings.Cut(text, ": ")
	if !ok {
		return &FieldError{Message: text}
	}
	return &FieldError{Field: field, Message: msg}
}

// The budgets an evaluation can break, as BudgetError.Budget and the metrics' budget label.
const (
	BudgetTime   = "time"
	BudgetMemory = "memory"
)

// BudgetError is an evaluation stopped for breaking its budget. It matches ErrBudgetExceeded;
// the errors wrapping it name the decision and the bundle revision.
type BudgetError struct {
	// Decision is the entrypoint evaluated, such as migration.policy.
	Decision string
	// Budget is the budget broken: BudgetTime or BudgetMemory.
	Budget string
	// Limit is the budget: Budget.Timeout or Budget.Memory.
	Limit Budget
	// Elapsed is how long the evaluation ran; Grew how many bytes the heap had grown by
	// when a memory budget stopped it.
	Elapsed time.Duration
	Grew    int64
}

func (e *BudgetError) Error() string {
	if e.Budget == BudgetMemory {
		return fmt.Sprintf("%v: the heap grew by %s in %v, over the memory budget of %s",
			ErrBudgetExceeded, mebibytes(e.Grew), e.Elapsed.Round(time.Millisecond), mebibytes(e.Limit.Memory))
	}
	return fmt.Sprintf("%v: stopped after %v, over the time budget of %v",
		ErrBudgetExceeded, e.Elapsed.Round(time.Millisecond), e.Limit.Timeout)
}

// Unwrap makes errors.Is(err, ErrBudgetExceeded) hold.
func (e *BudgetError) Unwrap() error { return ErrBudgetExceeded }

// mebibytes shows n bytes in MiB, with one decimal below 10 MiB.
func mebibytes(n int64) string {
	mib := float64(n) / (1 << 20)
	if mib < 10 {
		return fmt.Sprintf("%.1f MiB", mib)
	}
	return fmt.Sprintf("%.0f MiB", mib)
}
