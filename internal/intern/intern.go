// Package intern shares the strings many cached objects repeat: 5,000 nodes carry the same
// few hundred label keys ("cpu-feature.node.kubevirt.io/avx2", ...) and nearly every value is
// "true", yet each decoded object holds copies of its own.
//
// Go's unique package would do the sharing, but its table forgets a string once no Handle to
// it is left, and a cache keeps the strings, not Handles: after a GC the next node would get a
// fresh copy again. A Table keeps what it interned until it holds max entries, then starts
// over (sharing, never correctness, is what starting over loses).
package intern

import (
	"strings"
	"sync"
)

// Table interns strings, and the same strings boxed as interface values (what an unstructured
// object's map[string]any holds; boxing a string allocates). Safe for concurrent use.
type Table struct {
	max int

	mu    sync.Mutex
	strs  map[string]string
	boxes map[string]any
}

// Default is the process's one table for the strings cached objects share: the controllers'
// unstructured and metadata-only caches (kinds.CacheTransform), the Node cache
// (controllers.TrimNode) and the engine's whole-node views (engine.Nodes), which then share
// the node label strings the Node cache interned instead of holding entries of their own.
// Bounded at 65,536 entries of each sort: about 11 MB when full (5 MB of strings' entries,
// 6 MB of boxes, for 8-byte strings), once for the process rather than once per cache. Shared,
// it is far from full at scale: 10,000 compacted VMs and VMIs, 10,000 metadata-only VMIs and
// 5,000 nodes (cached and in a whole-node view) left it holding 15,534 strings and 15,073 boxes,
// without starting over.
var Default = New(1 << 16)

// New returns a table of up to max entries of each sort before it starts over.
func New(max int) *Table {
	return &Table{max: max, strs: map[string]string{}, boxes: map[string]any{}}
}

// String returns s, or the equal string the table holds.
func (t *Table) String(s string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stringLocked(s)
}

// Any returns s boxed as an interface value, shared with every equal string so boxed.
func (t *Table) Any(s string) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.anyLocked(s)
}

func (t *Table) anyLocked(s string) any {
	if v, ok := t.boxes[s]; ok {
		return v
	}
	if len(t.boxes) >= t.max {
		clear(t.boxes)
	}
	var v any = s
	t.boxes[s] = v
	return v
}

// Strings returns a copy of m with its keys and values interned (nil for an empty m).
func (t *Table) Strings(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range m {
		out[t.stringLocked(k)] = t.stringLocked(v)
	}
	return out
}

func (t *Table) stringLocked(s string) string {
	if v, ok := t.strs[s]; ok {
		return v
	}
	if len(t.strs) >= t.max {
		clear(t.strs)
	}
	t.strs[s] = s
	return s
}

// JSON returns a copy of v, a decoded JSON value (map[string]any, []any, string, bool, int64,
// float64, nil: what an unstructured object holds), with every object key interned and every
// string value share says to share (given its key, "" in an array) interned and boxed once;
// other values stay as they are. The copy's maps are sized to fit.
func (t *Table) JSON(v any, share func(key, value string) bool) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.jsonLocked("", v, share)
}

func (t *Table) jsonLocked(key string, v any, share func(key, value string) bool) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[t.stringLocked(k)] = t.jsonLocked(k, e, share)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = t.jsonLocked("", e, share)
		}
		return out
	case string:
		if !share(key, v) {
			return v
		}
		return t.anyLocked(v)
	default:
		return v
	}
}

// Repeated tells the string values of decoded Kubernetes objects that many objects repeat
// and are worth sharing (a JSON predicate): short ones (condition types and statuses, phases,
// label values), but not those each object or each version of it has its own
// (resourceVersion, timestamps), which would only fill the table.
func Repeated(key, value string) bool {
	return len(value) <= 32 && key != "resourceVersion" && !strings.HasSuffix(key, "Time") && !strings.HasSuffix(key, "Timestamp")
}
