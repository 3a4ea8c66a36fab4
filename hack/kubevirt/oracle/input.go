//go:build virtrules_oracle

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	v1 "kubevirt.io/api/core/v1"
)

// document is one object of an input stream.
type document struct {
	source string // FILE#N, N counting the file's documents from 1
	obj    *unstructured.Unstructured
}

// kindOf names what the document holds for the output lines.
func (d document) kindOf() (kind, namespace, name string) {
	return d.obj.GetKind(), d.obj.GetNamespace(), d.obj.GetName()
}

// isKubeVirt tells whether the document is an object convert and admit handle: a
// VirtualMachine or VirtualMachineInstance of kubevirt.io (v1, or the deprecated v1alpha3
// KubeVirt still serves with the same schema).
func (d document) isKubeVirt() bool {
	gv := d.obj.GetAPIVersion()
	if gv != v1.GroupVersion.String() && gv != v1.GroupVersion.Group+"/v1alpha3" {
		return false
	}
	k := d.obj.GetKind()
	return k == v1.VirtualMachineGroupVersionKind.Kind || k == v1.VirtualMachineInstanceGroupVersionKind.Kind
}

// readDocuments reads every document of the named files ("-": stdin), in order. Empty
// documents are dropped; a List's items are documents of their own. The error joins those of
// the files that could not be read or parsed to their end; the documents before a parse error
// are returned all the same.
func readDocuments(files []string, stdin io.Reader) ([]document, error) {
	var docs []document
	var errs []error
	for _, file := range files {
		got, err := readFile(file, stdin)
		docs = append(docs, got...)
		errs = append(errs, err)
	}
	return docs, errors.Join(errs...)
}

func readFile(file string, stdin io.Reader) ([]document, error) {
	if file == "-" {
		return decodeStream("stdin", stdin)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	defer f.Close()
	return decodeStream(file, f)
}

func decodeStream(name string, r io.Reader) ([]document, error) {
	var docs []document
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	for n := 1; ; n++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return docs, nil
			}
			return docs, fmt.Errorf("parse %s, document %d: %w", name, n, err)
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
			n--
			continue
		}
		source := fmt.Sprintf("%s#%d", name, n)
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			// A scalar or a list at the top: not an object, reported as a skipped document.
			docs = append(docs, document{source: source, obj: &unstructured.Unstructured{Object: map[string]any{}}})
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.IsList() {
			items, _, _ := unstructured.NestedSlice(m, "items")
			for i, item := range items {
				im, ok := item.(map[string]any)
				if !ok {
					im = map[string]any{}
				}
				docs = append(docs, document{source: fmt.Sprintf("%s.items[%d]", source, i), obj: &unstructured.Unstructured{Object: im}})
			}
			continue
		}
		docs = append(docs, document{source: source, obj: obj})
	}
}

// skippedNote says why a document is not handled.
func skippedNote(d document) string {
	kind, gv := d.obj.GetKind(), d.obj.GetAPIVersion()
	if kind == "" {
		return "skipped: not a Kubernetes object (no kind)"
	}
	return fmt.Sprintf("skipped: %s %s is not a kubevirt.io/v1 VirtualMachine or VirtualMachineInstance", gv, kind)
}

// fileArgs checks the positional arguments of convert and admit.
func fileArgs(cmd string, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%s: no input file (use - for stdin)", cmd)
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") && a != "-" {
			return fmt.Errorf("%s: flag %s after the files", cmd, a)
		}
	}
	return nil
}

// eachDocument runs a JSON Lines command: it builds the cluster of kvFile whose nodes are of
// arch, gets the answer function of the command from prepare (which sees every document, for
// commands that answer for one object from the others), and writes one line per document of
// files, in order.
// Documents read before a file that cannot be read or parsed still get their lines.
func eachDocument(cmd string, files []string, kvFile, arch string, stdin io.Reader, out io.Writer, prepare func(*cluster, []document) (func(document) any, error)) error {
	if err := fileArgs(cmd, files); err != nil {
		return err
	}
	c, err := newCluster(kvFile, arch)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	docs, readErr := readDocuments(files, stdin)
	if err := c.addReferences(docs); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	answer, err := prepare(c, docs)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for _, d := range docs {
		if err := enc.Encode(answer(d)); err != nil {
			return fmt.Errorf("%s: write: %w", cmd, err)
		}
	}
	if readErr != nil {
		return fmt.Errorf("%s: %w", cmd, readErr)
	}
	return nil
}
