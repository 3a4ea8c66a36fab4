package manifest

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"strings"
)

// Reason codes of an Error: what kind of problem the object has.
const (
	// ReasonUnreadable: the document is not YAML or JSON, or not a Kubernetes object.
	ReasonUnreadable = "Unreadable"
	// ReasonInvalid: a field has a value the rules or KubeVirt's types refuse.
	ReasonInvalid = "Invalid"
	// ReasonDuplicate: the same object is given twice.
	ReasonDuplicate = "Duplicate"
	// ReasonInconsistent: the object refers to one the inputs do not hold (a pending
	// migration of an absent VMI).
	ReasonInconsistent = "Inconsistent"
	// ReasonDecisionFailed: the rules failed to decide for the object.
	ReasonDecisionFailed = "DecisionFailed"
	// ReasonUnsupported: the object uses a field KubeVirt has that the decision does not
	// model, so it cannot say what KubeVirt would do (a pool.kubevirt.io pool's
	// nodeSelectorRequirementMatcher).
	ReasonUnsupported = "Unsupported"
)

// Error is one problem with one object (or with a document that is none), located: the
// object's kind and name, FILE:LINE (or the cluster) and the field at fault. It prints as
// `FILE:LINE: Kind namespace/name: field: message`, the way compilers and linters do.
type Error struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Location is FILE:LINE, the line of the field at fault (the object's first line when
	// no field is), or where a live object was read ("cluster").
	Location string `json:"location"`
	// Field is the path of the field at fault inside the document ("items[3].spec.vmiName").
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// Reason is one of the Reason codes.
	Reason string `json:"reason,omitempty"`
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Location)
	b.WriteString(": ")
	if d := e.Object(); d != "" {
		b.WriteString(d)
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Object is "Kind namespace/name", "Kind name", or "" when the document names no object.
func (e *Error) Object() string {
	switch {
	case e.Kind == "" && e.Name == "":
		return ""
	case e.Namespace != "" && e.Name == "":
		return e.Kind + " " + e.Namespace + "/<no name>"
	case e.Namespace != "":
		return e.Kind + " " + e.Namespace + "/" + e.Name
	default:
		return strings.TrimSpace(e.Kind + " " + e.Name)
	}
}

// Errors splits err into the problems of single objects (every *Error it holds, however
// joined or wrapped) and the rest, which are not about one object (a path that cannot be
// read, inputs over their size limit): nil when there is none.
func Errors(err error) ([]*Error, error) {
	var objs []*Error
	var rest []error
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if oe, ok := e.(*Error); ok {
			objs = append(objs, oe)
			return
		}
		if joined, ok := e.(interface{ Unwrap() []error }); ok {
			for _, inner := range joined.Unwrap() {
				walk(inner)
			}
			return
		}
		rest = append(rest, e)
	}
	walk(err)
	return objs, errors.Join(rest...)
}

// SortErrors sorts errs by file, then line as a number, then object and field.
func SortErrors(errs []*Error) {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		af, al := splitLocation(a.Location)
		bf, bl := splitLocation(b.Location)
		return cmp.Or(strings.Compare(af, bf), cmp.Compare(al, bl),
			strings.Compare(a.Object(), b.Object()), strings.Compare(a.Field, b.Field), strings.Compare(a.Message, b.Message))
	})
}

// splitLocation is FILE:LINE as its file and line (0 when there is none).
func splitLocation(loc string) (string, int) {
	i := strings.LastIndexByte(loc, ':')
	if i < 0 {
		return loc, 0
	}
	n, err := strconv.Atoi(loc[i+1:])
	if err != nil {
		return loc, 0
	}
	return loc[:i], n
}
