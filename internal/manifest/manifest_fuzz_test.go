package manifest

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParse feeds the manifest reader arbitrary YAML and JSON streams (seeds: testdata/fuzz,
// the project's examples among them). Whatever it is given, it never panics, every error
// names the stream and the document ("fuzz.yaml:N: ..."), and every object it returns has
// the apiVersion, kind and name checkHeader promises.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 {
			t.Skip("bounded inputs: a stream is at most 64 KiB here")
		}
		objs, err := Parse("fuzz.yaml", bytes.NewReader(data))
		if err != nil {
			for _, e := range unjoin(err) {
				if !strings.HasPrefix(e.Error(), "fuzz.yaml:") {
					t.Errorf("error names no stream and document: %v", e)
				}
			}
		}
		for _, o := range objs {
			if o.Source != "fuzz.yaml" || o.Document < 1 {
				t.Errorf("object %s at %s: want a document of fuzz.yaml", o.Describe(), o.Position())
			}
			// Every located field is on a line of the stream.
			lines := bytes.Count(data, []byte("\n")) + 1
			for _, field := range []string{"", "metadata.name", "spec.selectors.a.b", "items[0].x", "spec.volumes[1]"} {
				if l := o.LineOf(field); l < 1 || l > lines {
					t.Errorf("%s: %q at line %d, outside the stream's %d lines", o.Describe(), field, l, lines)
				}
			}
			if o.GetAPIVersion() == "" || o.GetKind() == "" {
				t.Errorf("%s: object without apiVersion or kind: %v", o.Position(), o.Object)
			}
			if !o.IsList() && o.GetName() == "" {
				t.Errorf("%s: object without a name: %v", o.Position(), o.Object)
			}
			if o.IsList() {
				t.Errorf("%s: a List returned as an object, not expanded", o.Position())
			}
		}
	})
}

// unjoin splits errors.Join's error into the errors it joined.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}
