package engine

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// xmlTerm reads an XML document into the tree the vm.defaults rules read, built directly as
// Rego values: each element an object with its attributes under "@name", its non-blank text
// under "#text" and its child elements as lists under their tag names. The tree follows
// libvirt's documented element paths (devices/interface/mac@address).
func xmlTerm(doc []byte) (*ast.Term, error) {
	type frame struct {
		items    [][2]*ast.Term
		children map[string][]*ast.Term
		order    []string
		text     strings.Builder
	}
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var stack []*frame
	var root *ast.Term
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read domain XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			f := &frame{items: make([][2]*ast.Term, 0, len(t.Attr)+2)}
			for _, a := range t.Attr {
				f.items = append(f.items, item("@"+a.Name.Local, ast.StringTerm(a.Value)))
			}
			stack = append(stack, f)
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].text.Write(t)
			}
		case xml.EndElement:
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, tag := range f.order {
				f.items = append(f.items, item(tag, ast.ArrayTerm(f.children[tag]...)))
			}
			if s := strings.TrimSpace(f.text.String()); s != "" {
				f.items = append(f.items, item("#text", ast.StringTerm(s)))
			}
			el := ast.ObjectTerm(f.items...)
			if len(stack) == 0 {
				root = el
				continue
			}
			parent := stack[len(stack)-1]
			if parent.children == nil {
				parent.children = map[string][]*ast.Term{}
			}
			if _, seen := parent.children[t.Name.Local]; !seen {
				parent.order = append(parent.order, t.Name.Local)
			}
			parent.children[t.Name.Local] = append(parent.children[t.Name.Local], el)
		}
	}
	if root == nil {
		return nil, errors.New("read domain XML: no root element")
	}
	return root, nil
}
