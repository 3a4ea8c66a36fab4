package defaults

import (
	"reflect"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
)

// The shape cache's own logic over made-up answers; its agreement with full evaluation over
// real libvirt is checked in test/defaults.

func mac(i int) []any { return []any{"domain", "devices", "interfaces", i, "macAddress"} }

var uuidPath = []any{"domain", "firmware", "uuid"}

// answer is a full answer for an object whose identity defaults are ids.
func answer(ids ...engine.VMDefault) []engine.VMDefault {
	out := []engine.VMDefault{
		{Path: []any{"domain", "clock", "utc"}, Value: map[string]any{}},
		{Path: []any{"domain", "machine", "type"}, Value: "pc-q35-7.2"},
	}
	return append(out, ids...)
}

func ids(macA, uuid string) []engine.VMDefault {
	return []engine.VMDefault{{Path: mac(0), Value: macA}, {Path: uuidPath, Value: uuid}}
}

func TestShapeCachePutsEachObjectsIdentityIn(t *testing.T) {
	c, _ := NewShapeCache(4, nil)
	key := shapeKey{1}
	first := ids("02:00:00:00:00:01", "u-1")
	warned := []engine.FieldError{{Field: "domain.devices.gpus[0]", Message: "the node's"}}
	if !c.put(key, "r1", answer(first...), warned, first) {
		t.Fatal("a well-behaved answer was not kept")
	}
	second := ids("02:00:00:00:00:02", "u-2")
	got, warnings, revision, ok := c.get(key, second)
	if !ok || revision != "r1" {
		t.Fatalf("get: ok %v revision %q", ok, revision)
	}
	if !reflect.DeepEqual(warnings, warned) {
		t.Errorf("warnings %v, want %v", warnings, warned)
	}
	if want := answer(second...); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	// What one object's answer holds is its own: changing it changes no other answer.
	got[0].Value.(map[string]any)["changed"] = true
	again, _, _, _ := c.get(key, second)
	if len(again[0].Value.(map[string]any)) != 0 {
		t.Errorf("answers share a value: %v", again[0].Value)
	}
	if _, _, _, ok := c.get(shapeKey{2}, second); ok {
		t.Error("a hit for a shape never kept")
	}
}

func TestShapeCacheKeepsOnlyAnswersThatKeepThePromise(t *testing.T) {
	id := ids("02:00:00:00:00:01", "u-1")
	for name, defs := range map[string][]engine.VMDefault{
		"an identity default missing":            answer(id[0]),
		"an identity default with another value": answer(id[0], engine.VMDefault{Path: uuidPath, Value: "u-other"}),
		"an identity value elsewhere": append(answer(id...), engine.VMDefault{
			Path: []any{"domain", "firmware", "serial"}, Value: map[string]any{"x": []any{"serial-u-1"}},
		}),
	} {
		c, _ := NewShapeCache(4, nil)
		if c.put(shapeKey{1}, "r", defs, nil, id) || c.Len() != 0 {
			t.Errorf("%s: kept", name)
		}
	}
}

func TestShapeCacheMissesWhenTheIdentityDefaultsDiffer(t *testing.T) {
	c, _ := NewShapeCache(4, nil)
	first := ids("02:00:00:00:00:01", "u-1")
	c.put(shapeKey{1}, "r", answer(first...), nil, first)
	// The same shape with other identity defaults cannot be: but if a bundle says so, the
	// object is evaluated in full rather than given a wrong answer.
	if _, _, _, ok := c.get(shapeKey{1}, first[:1]); ok {
		t.Error("hit with fewer identity defaults")
	}
	if _, _, _, ok := c.get(shapeKey{1}, []engine.VMDefault{{Path: mac(1), Value: "x"}, first[1]}); ok {
		t.Error("hit with identity defaults at other paths")
	}
}

func TestShapeCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c, _ := NewShapeCache(2, nil)
	id := ids("02:00:00:00:00:01", "u-1")
	for i := range byte(3) {
		c.put(shapeKey{i}, "r", answer(id...), nil, id)
		if i == 1 {
			c.get(shapeKey{0}, id) // 0 used last: 1 goes first
		}
	}
	if c.Len() != 2 {
		t.Fatalf("%d shapes kept, want 2", c.Len())
	}
	if _, _, _, ok := c.get(shapeKey{1}, id); ok {
		t.Error("the least recently used shape is still kept")
	}
	if _, _, _, ok := c.get(shapeKey{0}, id); !ok {
		t.Error("a recently used shape was evicted")
	}
}

func TestShapeKeyTellsShapesApart(t *testing.T) {
	digest, cluster := [32]byte{1}, [32]byte{7}
	base := keyOf(digest, cluster, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q35"}})
	if base != keyOf([32]byte{1}, cluster, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q35"}}) {
		t.Error("one shape, two keys")
	}
	for name, key := range map[string]shapeKey{
		"cluster":           keyOf(digest, [32]byte{8}, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q35"}}),
		"shape spec":        keyOf([32]byte{2}, cluster, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q35"}}),
		"bundle activation": keyOf(digest, cluster, 2, 1, "VirtualMachine", engine.Machines{"amd64": {"q35"}}),
		"libvirt epoch":     keyOf(digest, cluster, 1, 2, "VirtualMachine", engine.Machines{"amd64": {"q35"}}),
		"kind":              keyOf(digest, cluster, 1, 1, "VirtualMachineInstance", engine.Machines{"amd64": {"q35"}}),
		"machines":          keyOf(digest, cluster, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q35", "pc"}}),
		"machines split":    keyOf(digest, cluster, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q3", "5"}}),
		"arm64 machines":    keyOf(digest, cluster, 1, 1, "VirtualMachine", engine.Machines{"amd64": {"q35"}, "arm64": {"virt"}}),
	} {
		if key == base {
			t.Errorf("another %s, the same key", name)
		}
	}
}
