package engine

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// xmlTerm reads an XML document into the tree the vm.defaults rules read, built directly as
// Rego values: each element an object with its attributes under "@name", its non-blank text
// under "#text" and its child elements as lists under their tag names. The tree follows
// libvirt's documented element paths (devices/interface/mac@address).
//
// libvirt writes plain XML (elements, attributes, text, the five predefined entities and
// character references): that is read by a scanner of its own, several times faster than
// encoding/xml. A document with anything else (comments, CDATA, DTDs, processing
// instructions past the prolog, carriage returns) is read with encoding/xml; both give the
// same tree (TestXMLTermScannerAgreesWithEncodingXML).
func xmlTerm(doc []byte) (*ast.Term, error) {
	if t, ok := scanXMLTerm(doc); ok {
		return t, nil
	}
	return decodeXMLTerm(doc)
}

// xmlFrame is an element being read.
type xmlFrame struct {
	name     string
	items    [][2]*ast.Term
	children []xmlChildren // by tag, in order of first appearance
	text     []byte
}

// xmlChildren are an element's child elements of one tag.
type xmlChildren struct {
	tag   string
	elems []*ast.Term
}

// xmlStrings interns the strings of one document as terms: tag and attribute names and most
// values repeat (type, pci, 0x0000), and a term is immutable once built.
type xmlStrings map[string]*ast.Term

func (x xmlStrings) term(b []byte) *ast.Term {
	if t, ok := x[string(b)]; ok {
		return t
	}
	t := ast.StringTerm(string(b))
	x[string(b)] = t
	return t
}

// addChild adds a child element; elements have few distinct child tags, so a list is faster
// than a map.
func (f *xmlFrame) addChild(tag string, el *ast.Term) {
	for i := range f.children {
		if f.children[i].tag == tag {
			f.children[i].elems = append(f.children[i].elems, el)
			return
		}
	}
	f.children = append(f.children, xmlChildren{tag: tag, elems: []*ast.Term{el}})
}

var textKey = ast.StringTerm("#text")

func (f *xmlFrame) term(strs xmlStrings) *ast.Term {
	for _, c := range f.children {
		f.items = append(f.items, [2]*ast.Term{strs.term([]byte(c.tag)), ast.ArrayTerm(c.elems...)})
	}
	if text := bytes.TrimSpace(f.text); len(text) > 0 {
		f.items = append(f.items, [2]*ast.Term{textKey, strs.term(text)})
	}
	return ast.ObjectTerm(f.items...)
}

// localName is a name without its namespace prefix, as encoding/xml's Name.Local: a colon
// first or last is no prefix's.
func localName(b []byte) string {
	if i := bytes.IndexByte(b, ':'); i >= 1 && i <= len(b)-2 {
		b = b[i+1:]
	}
	return string(b)
}

// isXMLName tells a plain ASCII name: a letter, '_' or ':', then also digits, '.' and '-'.
func isXMLName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for i, c := range b {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '.' || c == '-')) {
			return false
		}
	}
	return true
}

func isXMLSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' }

// scanXMLTerm reads the plain XML libvirt writes; ok is false for anything else, including
// malformed documents (encoding/xml then says what is wrong).
func scanXMLTerm(doc []byte) (root *ast.Term, ok bool) {
	// Plain ASCII without control characters but tabs and newlines: nothing encoding/xml
	// would check or normalize.
	for _, c := range doc {
		if c >= 0x80 || (c < 0x20 && c != '\t' && c != '\n') {
			return nil, false
		}
	}
	i := 0
	// An XML declaration may lead.
	if bytes.HasPrefix(doc, []byte("<?xml")) {
		end := bytes.Index(doc, []byte("?>"))
		if end < 0 {
			return nil, false
		}
		i = end + 2
	}
	var stack []*xmlFrame
	strs := xmlStrings{}
	for i < len(doc) {
		if doc[i] != '<' {
			j := bytes.IndexByte(doc[i:], '<')
			if j < 0 {
				j = len(doc) - i
			}
			text := doc[i : i+j]
			if len(stack) == 0 {
				if len(bytes.TrimLeft(text, " \t\n")) > 0 {
					return nil, false
				}
			} else {
				t, ok := unescapeXML(text)
				if !ok {
					return nil, false
				}
				f := stack[len(stack)-1]
				f.text = append(f.text, t...)
			}
			i += j
			continue
		}
		if i+1 >= len(doc) {
			return nil, false
		}
		switch doc[i+1] {
		case '!', '?':
			return nil, false
		case '/':
			end := bytes.IndexByte(doc[i:], '>')
			if end < 0 || len(stack) == 0 {
				return nil, false
			}
			name := string(bytes.TrimRight(doc[i+2:i+end], " \t\n"))
			f := stack[len(stack)-1]
			if name != f.name {
				return nil, false
			}
			stack = stack[:len(stack)-1]
			el := f.term(strs)
			if len(stack) == 0 {
				if root != nil {
					return nil, false
				}
				root = el
			} else {
				stack[len(stack)-1].addChild(localName([]byte(name)), el)
			}
			i += end + 1
			continue
		}
		if len(stack) == 0 && root != nil {
			return nil, false
		}
		// A start tag: name, attributes, then > or />.
		j := i + 1
		for j < len(doc) && !isXMLSpace(doc[j]) && doc[j] != '>' && doc[j] != '/' {
			j++
		}
		if j == i+1 || j >= len(doc) {
			return nil, false
		}
		if !isXMLName(doc[i+1 : j]) {
			return nil, false
		}
		f := &xmlFrame{name: string(doc[i+1 : j]), items: make([][2]*ast.Term, 0, 4)}
		selfClosing := false
		for {
			for j < len(doc) && isXMLSpace(doc[j]) {
				j++
			}
			if j >= len(doc) {
				return nil, false
			}
			if doc[j] == '>' {
				j++
				break
			}
			if doc[j] == '/' {
				if j+1 >= len(doc) || doc[j+1] != '>' {
					return nil, false
				}
				selfClosing = true
				j += 2
				break
			}
			eq := bytes.IndexByte(doc[j:], '=')
			if eq <= 0 {
				return nil, false
			}
			name := doc[j : j+eq]
			if !isXMLName(name) {
				return nil, false
			}
			j += eq + 1
			if j >= len(doc) || (doc[j] != '\'' && doc[j] != '"') {
				return nil, false
			}
			quote := doc[j]
			end := bytes.IndexByte(doc[j+1:], quote)
			if end < 0 {
				return nil, false
			}
			raw := doc[j+1 : j+1+end]
			if bytes.IndexByte(raw, '<') >= 0 {
				return nil, false
			}
			value, ok := unescapeXML(raw)
			if !ok {
				return nil, false
			}
			key := strs.term(append([]byte{'@'}, localName(name)...))
			f.items = append(f.items, [2]*ast.Term{key, strs.term(value)})
			j += end + 2
			if j < len(doc) && !isXMLSpace(doc[j]) && doc[j] != '>' && doc[j] != '/' {
				return nil, false
			}
		}
		i = j
		if !selfClosing {
			stack = append(stack, f)
			continue
		}
		el := f.term(strs)
		if len(stack) == 0 {
			root = el
		} else {
			stack[len(stack)-1].addChild(localName([]byte(f.name)), el)
		}
	}
	if len(stack) > 0 || root == nil {
		return nil, false
	}
	return root, true
}

// unescapeXML replaces the predefined entities and character references; ok is false for any
// other entity or a stray '&'.
func unescapeXML(b []byte) ([]byte, bool) {
	if bytes.IndexByte(b, '&') < 0 {
		return b, true
	}
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		amp := bytes.IndexByte(b, '&')
		if amp < 0 {
			out = append(out, b...)
			break
		}
		out = append(out, b[:amp]...)
		b = b[amp:]
		semi := bytes.IndexByte(b, ';')
		if semi < 0 {
			return nil, false
		}
		switch ent := string(b[1:semi]); ent {
		case "lt":
			out = append(out, '<')
		case "gt":
			out = append(out, '>')
		case "amp":
			out = append(out, '&')
		case "apos":
			out = append(out, '\'')
		case "quot":
			out = append(out, '"')
		default:
			var n uint64
			var err error
			switch {
			case strings.HasPrefix(ent, "#x"):
				n, err = strconv.ParseUint(ent[2:], 16, 32)
			case strings.HasPrefix(ent, "#"):
				n, err = strconv.ParseUint(ent[1:], 10, 32)
			default:
				return nil, false
			}
			// Printable ASCII only; encoding/xml reads the rest.
			if err != nil || n < 0x20 || n >= 0x7f {
				return nil, false
			}
			out = append(out, string(rune(n))...)
		}
		b = b[semi+1:]
	}
	return out, true
}

// decodeXMLTerm reads any XML document with encoding/xml.
func decodeXMLTerm(doc []byte) (*ast.Term, error) {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var stack []*xmlFrame
	var root *ast.Term
	strs := xmlStrings{}
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
			f := &xmlFrame{items: make([][2]*ast.Term, 0, len(t.Attr)+2)}
			for _, a := range t.Attr {
				f.items = append(f.items, item("@"+a.Name.Local, ast.StringTerm(a.Value)))
			}
			stack = append(stack, f)
		case xml.CharData:
			if len(stack) > 0 {
				f := stack[len(stack)-1]
				f.text = append(f.text, t...)
			}
		case xml.EndElement:
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			el := f.term(strs)
			if len(stack) == 0 {
				root = el
				continue
			}
			stack[len(stack)-1].addChild(t.Name.Local, el)
		}
	}
	if root == nil {
		return nil, errors.New("read domain XML: no root element")
	}
	return root, nil
}
