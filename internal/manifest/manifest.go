// Package manifest reads Kubernetes manifests the way kubectl does: YAML or JSON files,
// directories, or stdin; several documents per file; `List` kinds expanded. Every object
// remembers where it came from, so errors read `FILE:LINE: Kind namespace/name: field: what
// is wrong`, LINE the line of the field at fault, as editors and CI annotations read it.
package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Stdin is the path that reads standard input.
const Stdin = "-"

// Object is one Kubernetes object and where it was read.
type Object struct {
	// Source is the file path, "-" for stdin, or where a live object was read ("cluster").
	Source string
	// Document is the 1-based number of the YAML document within Source.
	Document int
	// Line is the line of the object's first line in Source; 0 for an object not read from
	// a file.
	Line int
	// Item is the field path prefix inside a List document ("items[2]."), "" otherwise.
	Item string
	*unstructured.Unstructured

	text *text
}

// Position is "FILE:LINE" of the object's first line, or Source alone for an object not
// read from a file (Line 0), such as one listed from a cluster.
func (o Object) Position() string {
	if o.Line == 0 {
		return o.Source
	}
	return o.Source + ":" + strconv.Itoa(o.Line)
}

// LineOf is the line of field (a path such as "spec.selectors.kubevirt.io/size" or
// "spec.volumes[2]", inside the object: without Item) in Source; the object's own line when
// the object has no such field, or was not read from a file.
func (o Object) LineOf(field string) int {
	if o.text == nil || field == "" {
		return o.Line
	}
	if line := o.text.line(field); line > 0 {
		return line
	}
	return o.Line
}

// Locate is FILE:LINE of field, as LineOf finds it; Source alone for a live object.
func (o Object) Locate(field string) string {
	if o.Line == 0 {
		return o.Source
	}
	return o.Source + ":" + strconv.Itoa(o.LineOf(field))
}

// Error is a problem with field (a path such as "metadata.labels.size"; "" for the object as
// a whole) of o, with a Reason code: located at the field's line, naming the object.
func (o Object) Error(reason, field, format string, args ...any) *Error {
	e := &Error{Location: o.Locate(field), Field: o.Item + field, Message: fmt.Sprintf(format, args...), Reason: reason}
	if o.Unstructured != nil {
		e.Kind, e.Namespace, e.Name = o.GetKind(), o.GetNamespace(), o.GetName()
	}
	return e
}

// Errorf is Error with the reason Invalid.
func (o Object) Errorf(field, format string, args ...any) error {
	return o.Error(ReasonInvalid, field, format, args...)
}

// Describe is "Kind namespace/name" or "Kind name", for messages.
func (o Object) Describe() string {
	if ns := o.GetNamespace(); ns != "" {
		return o.GetKind() + " " + ns + "/" + o.GetName()
	}
	return o.GetKind() + " " + o.GetName()
}

// DefaultMaxBytes bounds what Read reads of all its inputs together.
const DefaultMaxBytes int64 = 256 << 20

// Read reads every object under paths: files, directories (their .yaml, .yml and .json files,
// recursively, in lexical order) and "-" for stdin. Malformed documents are errors naming the
// file and document; all of them are reported, not just the first. Only regular files are
// read (a FIFO or device, named or in a directory, is an error, never a read that blocks),
// and at most DefaultMaxBytes of all inputs together.
func Read(paths []string, stdin io.Reader) ([]Object, error) {
	return ReadLimited(paths, stdin, DefaultMaxBytes)
}

// ErrTooLarge is the error of inputs larger than their limit.
var ErrTooLarge = errors.New("inputs over their size limit")

// ReadLimited is Read reading at most maxBytes of all inputs together: past it, the file
// being read is an error wrapping ErrTooLarge and nothing more is read.
func ReadLimited(paths []string, stdin io.Reader, maxBytes int64) ([]Object, error) {
	var objs []Object
	var errs []error
	budget := &budget{left: maxBytes, max: maxBytes}
	for _, p := range paths {
		files, err := expand(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range files {
			got, err := readFile(f, stdin, budget)
			objs = append(objs, got...)
			if err != nil {
				errs = append(errs, err)
			}
			if budget.left < 0 {
				return objs, errors.Join(errs...)
			}
		}
	}
	return objs, errors.Join(errs...)
}

// budget is what is left to read of all inputs.
type budget struct{ left, max int64 }

// budgeted reads from r what the budget allows, then fails.
type budgeted struct {
	r io.Reader
	b *budget
}

func (b budgeted) Read(p []byte) (int, error) {
	if b.b.left < 0 {
		return 0, fmt.Errorf("%w (%d bytes, all inputs together)", ErrTooLarge, b.b.max)
	}
	if int64(len(p)) > b.b.left+1 {
		p = p[:b.b.left+1]
	}
	n, err := b.r.Read(p)
	b.b.left -= int64(n)
	if b.b.left < 0 {
		return 0, fmt.Errorf("%w (%d bytes, all inputs together)", ErrTooLarge, b.b.max)
	}
	return n, err
}

func expand(path string) ([]string, error) {
	if path == Stdin {
		return []string{Stdin}, nil
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if !info.IsDir() {
		if !info.Mode().IsRegular() {
			return nil, fmt.Errorf("read %s: not a regular file (%s)", path, info.Mode().Type())
		}
		return []string{path}, nil
	}
	var files []string
	var irregular []error
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !slices.Contains([]string{".yaml", ".yml", ".json"}, strings.ToLower(filepath.Ext(p))) {
			return nil
		}
		// A symbolic link is read when it leads to a regular file.
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			irregular = append(irregular, fmt.Errorf("read %s: not a regular file (%s)", p, info.Mode().Type()))
			return nil
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(irregular) > 0 {
		return nil, errors.Join(irregular...)
	}
	slices.Sort(files)
	return files, nil
}

func readFile(path string, stdin io.Reader, b *budget) ([]Object, error) {
	var r io.Reader
	if path == Stdin {
		r = stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		defer f.Close()
		r = f
	}
	return Parse(path, budgeted{r: r, b: b})
}

// Parse reads the documents of one stream; source names it in errors. Documents are split
// as the API machinery's YAML reader splits them (a line starting with "---"), keeping the
// line each starts at.
func Parse(source string, r io.Reader) ([]Object, error) {
	br := bufio.NewReader(r)
	var objs []Object
	var errs []error
	var buf bytes.Buffer
	doc, line, start := 1, 0, 1
	flush := func() {
		if buf.Len() > 0 {
			got, err := parseDocument(source, doc, start, bytes.Clone(buf.Bytes()))
			objs = append(objs, got...)
			if err != nil {
				errs = append(errs, err)
			}
			doc++
		}
		buf.Reset()
	}
	for {
		l, err := br.ReadBytes('\n')
		if len(l) > 0 {
			line++
			if rest, ok := bytes.CutPrefix(l, []byte("---")); ok {
				if t := bytes.TrimSpace(rest); len(t) > 0 && t[0] != '#' {
					errs = append(errs, &Error{Location: fmt.Sprintf("%s:%d", source, line), Message: fmt.Sprintf("invalid document separator: %q", bytes.TrimSpace(l)), Reason: ReasonUnreadable})
					return objs, errors.Join(errs...)
				}
				flush()
				start = line + 1
			} else {
				buf.Write(l)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: read: %w", source, line, err))
			return objs, errors.Join(errs...)
		}
	}
	flush()
	return objs, errors.Join(errs...)
}

// yamlLine finds "line N" in a YAML parser's message.
var yamlLine = regexp.MustCompile(`line (\d+)`)

// unreadable is the error of a document that cannot be parsed: at the line the parser names
// (counted from the document's first line), else at the document's first content line.
func unreadable(source string, start int, raw []byte, err error) *Error {
	line := firstContentLine(raw, start)
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil && n > 0 {
			line = start + n - 1
		}
	}
	return &Error{Location: fmt.Sprintf("%s:%d", source, line), Message: "parse: " + err.Error(), Reason: ReasonUnreadable}
}

func parseDocument(source string, doc, start int, raw []byte) ([]Object, error) {
	if len(bytes.TrimSpace(stripComments(raw))) == 0 {
		return nil, nil
	}
	var content any
	// Strict: a key given twice is an error (kubectl refuses it too), never "the last wins".
	if err := yaml.UnmarshalStrict(raw, &content); err != nil {
		return nil, unreadable(source, start, raw, err)
	}
	if content == nil {
		return nil, nil
	}
	line := firstContentLine(raw, start)
	if _, ok := content.(map[string]any); !ok {
		return nil, &Error{Location: fmt.Sprintf("%s:%d", source, line), Message: "want a Kubernetes object (a mapping), got " + typeName(content), Reason: ReasonUnreadable}
	}
	// Again, keeping integers as int64 the way the API machinery does.
	var m map[string]any
	if err := utilyaml.Unmarshal(raw, &m); err != nil {
		return nil, unreadable(source, start, raw, err)
	}
	u := &unstructured.Unstructured{Object: m}
	top := Object{Source: source, Document: doc, Line: line, Unstructured: u, text: &text{raw: raw, first: start, dash: -1}}
	if err := checkHeader(top); err != nil {
		return nil, err
	}
	if !u.IsList() {
		return []Object{top}, nil
	}
	items, ok := m["items"].([]any)
	if !ok {
		return nil, top.Error(ReasonUnreadable, "items", "want a list of objects, got %s", typeName(m["items"]))
	}
	spans := itemSpans(raw, start, len(items))
	var objs []Object
	var errs []error
	for i, it := range items {
		obj := Object{Source: source, Document: doc, Line: top.LineOf(fmt.Sprintf("items[%d]", i)), Item: fmt.Sprintf("items[%d].", i)}
		if spans != nil {
			s := spans[i]
			obj.Line, obj.text = s.line, &text{raw: raw[s.start:s.end], first: s.line, dash: s.dash}
		}
		im, ok := it.(map[string]any)
		if !ok {
			errs = append(errs, obj.Error(ReasonUnreadable, "", "want an object, got %s", typeName(it)))
			continue
		}
		obj.Unstructured = &unstructured.Unstructured{Object: im}
		if err := checkHeader(obj); err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, obj)
	}
	return objs, errors.Join(errs...)
}

func checkHeader(o Object) error {
	for _, f := range []string{"apiVersion", "kind"} {
		v, ok := o.Object[f].(string)
		if !ok || v == "" {
			return o.Error(ReasonUnreadable, f, "want a non-empty string, got %s", typeName(o.Object[f]))
		}
	}
	if o.IsList() {
		return nil
	}
	md, ok := o.Object["metadata"].(map[string]any)
	if !ok {
		return o.Error(ReasonUnreadable, "metadata", "want an object with a name, got %s", typeName(o.Object["metadata"]))
	}
	if name, ok := md["name"].(string); !ok || name == "" {
		return o.Error(ReasonUnreadable, "metadata.name", "want a non-empty string, got %s", typeName(md["name"]))
	}
	if ns, ok := md["namespace"]; ok {
		if _, ok := ns.(string); !ok {
			return o.Error(ReasonUnreadable, "metadata.namespace", "want a string, got %s", typeName(ns))
		}
	}
	return nil
}

func stripComments(raw []byte) []byte {
	var out []byte
	for line := range bytes.Lines(raw) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
		}
	}
	return out
}

// typeName names the JSON type of v as people say it.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64, float64, int:
		return "a number"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// TypeName names the JSON type of v as people say it ("a boolean", "a list", ...).
func TypeName(v any) string { return typeName(v) }
