package manifest

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"sync"

	yamlv3 "go.yaml.in/yaml/v3"
)

// maxLocated bounds the text of one object that LineOf parses to find a field's line (the
// YAML parser's tree takes some 30 times the text): past it, a field's line is the object's.
const maxLocated = 8 << 20

// text is the text of one object as read (a document, or one item of a List document), for
// finding the line of a field when a message needs one. It is parsed then, once: most objects
// never need it, and a List of thousands is never parsed as a whole.
type text struct {
	raw []byte
	// first is the line of raw's first byte in the file.
	first int
	// dash is, for an item of a block sequence, the column of its "- " on raw's first line
	// (read as a space, so that the item parses alone); -1 otherwise.
	dash int

	once sync.Once
	root *yamlv3.Node
}

func (t *text) parse() *yamlv3.Node {
	t.once.Do(func() {
		if len(t.raw) > maxLocated {
			return
		}
		raw := t.raw
		if t.dash >= 0 && t.dash < len(raw) && raw[t.dash] == '-' {
			raw = bytes.Clone(raw)
			raw[t.dash] = ' '
		}
		var doc yamlv3.Node
		if err := yamlv3.Unmarshal(raw, &doc); err != nil || doc.Kind != yamlv3.DocumentNode || len(doc.Content) == 0 {
			return
		}
		t.root = doc.Content[0]
	})
	return t.root
}

// line is the line in the file of field (a path such as "spec.selectors.kubevirt.io/size" or
// "spec.volumes[2].name") in t: of the deepest part of the path the text has, so a missing
// field gives its parent's line; 0 when the text cannot be parsed.
func (t *text) line(field string) int {
	n := t.parse()
	if n == nil {
		return 0
	}
	line := n.Line
	for path := field; path != ""; {
		for n.Kind == yamlv3.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		if path[0] == '[' {
			end := strings.IndexByte(path, ']')
			if end < 0 || n.Kind != yamlv3.SequenceNode {
				break
			}
			i, err := strconv.Atoi(path[1:end])
			if err != nil || i < 0 || i >= len(n.Content) {
				break
			}
			n, line = n.Content[i], n.Content[i].Line
			path = strings.TrimPrefix(path[end+1:], ".")
			continue
		}
		if n.Kind != yamlv3.MappingNode {
			break
		}
		// The longest key the path starts with: label keys have dots of their own.
		best := -1
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			if (path == k || strings.HasPrefix(path, k+".") || strings.HasPrefix(path, k+"[")) &&
				(best < 0 || len(k) > len(n.Content[best].Value)) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		key := n.Content[best]
		path = strings.TrimPrefix(path[len(key.Value):], ".")
		n, line = n.Content[best+1], key.Line
	}
	return t.first + line - 1
}

// span is where one item of a List document is: its bytes' offsets and its first line.
type span struct {
	start, end, line, dash int
}

// itemSpans finds the items of a List document (raw, whose first line is line first of its
// file) without parsing it whole: a block sequence under a top-level `items:` key, or a JSON
// array under "items". nil when it cannot tell, or finds other than want items.
func itemSpans(raw []byte, first, want int) []span {
	var spans []span
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		spans = jsonItemSpans(raw, first)
	} else {
		spans = blockItemSpans(raw, first)
	}
	if len(spans) != want {
		return nil
	}
	return spans
}

func blockItemSpans(raw []byte, first int) []span {
	var spans []span
	base, dash := -1, -1
	inItems := false
	offset, line := 0, first
	for l := range bytes.Lines(raw) {
		start, cur := offset, line
		offset += len(l)
		line++
		content := bytes.TrimRight(l, " \t\r\n")
		indent := len(content) - len(bytes.TrimLeft(content, " "))
		body := content[indent:]
		if len(body) == 0 || body[0] == '#' {
			continue
		}
		if base < 0 {
			base = indent
		}
		if !inItems {
			if indent == base && bytes.HasPrefix(body, []byte("items:")) {
				if rest := bytes.TrimSpace(body[len("items:"):]); len(rest) > 0 && rest[0] != '#' {
					return nil // a flow sequence: not located item by item
				}
				inItems = true
			}
			continue
		}
		isDash := body[0] == '-' && (len(body) == 1 || body[1] == ' ')
		if dash < 0 {
			if !isDash || indent < base {
				return nil
			}
			dash = indent
		}
		switch {
		case indent == dash && isDash:
			if n := len(spans); n > 0 {
				spans[n-1].end = start
			}
			spans = append(spans, span{start: start, line: cur, dash: dash})
		case indent > dash:
		default:
			if n := len(spans); n > 0 {
				spans[n-1].end = start
			}
			return spans
		}
	}
	if n := len(spans); n > 0 {
		spans[n-1].end = len(raw)
	}
	return spans
}

func jsonItemSpans(raw []byte, first int) []span {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil
		}
		if key != "items" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil
			}
			continue
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
			return nil
		}
		var spans []span
		for dec.More() {
			start := int(dec.InputOffset())
			for start < len(raw) && bytes.IndexByte([]byte(" \t\r\n,"), raw[start]) >= 0 {
				start++
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil
			}
			end := int(dec.InputOffset())
			spans = append(spans, span{start: start, end: end, line: first + bytes.Count(raw[:start], []byte("\n")), dash: -1})
		}
		return spans
	}
	return nil
}

// firstContentLine is the line of raw's first line that is neither blank nor a comment.
func firstContentLine(raw []byte, first int) int {
	line := first
	for l := range bytes.Lines(raw) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return line
		}
		line++
	}
	return first
}
