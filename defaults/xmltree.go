package defaults

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

// xmlTree reads an XML document into the tree the vm.defaults rules read: each element an
// object with its attributes under "@name", its non-blank text under "#text" and its child
// elements as lists under their tag names. The tree follows libvirt's documented element
// paths (devices/interface/mac@address), independent of any Go binding.
func xmlTree(doc []byte) (map[string]any, error) {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var stack []map[string]any
	var text []*strings.Builder
	var root map[string]any
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
			el := make(map[string]any, len(t.Attr)+2)
			for _, a := range t.Attr {
				el["@"+a.Name.Local] = a.Value
			}
			if len(stack) > 0 {
				parent := stack[len(stack)-1]
				list, _ := parent[t.Name.Local].([]any)
				parent[t.Name.Local] = append(list, el)
			} else {
				root = el
			}
			stack = append(stack, el)
			text = append(text, &strings.Builder{})
		case xml.CharData:
			if len(text) > 0 {
				text[len(text)-1].Write(t)
			}
		case xml.EndElement:
			if s := strings.TrimSpace(text[len(text)-1].String()); s != "" {
				stack[len(stack)-1]["#text"] = s
			}
			stack, text = stack[:len(stack)-1], text[:len(text)-1]
		}
	}
	if root == nil {
		return nil, errors.New("read domain XML: no root element")
	}
	return root, nil
}
