package engine

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Callers match them with errors.Is; the wrapped message says which file,
// line, decision or object is at fault.
var (
	// ErrBundleRefused wraps every reason a bundle is not activated: it does not load or
	// compile, fails the strict check, fails its own tests, lacks a decision or has invalid
	// settings. The engine keeps serving the previous bundle.
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
