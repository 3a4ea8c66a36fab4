package engine

import (
	"errors"
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
)

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
