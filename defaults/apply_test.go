package defaults

import (
	"encoding/json"
	"reflect"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/virt-rules/virt-rules/engine"
)

// The patch apply returns turns the object as it was into the object defaulted, whatever
// exists on the way: nothing, an empty object, a null, a null list item, keys to escape.
func TestApplyPatchGivesTheDefaultedObject(t *testing.T) {
	original := `{"kind":"VirtualMachine","spec":{"template":{"spec":{
		"domain":{"cpu":{},"clock":null,"devices":{"interfaces":[{"name":"a"},null],"disks":[]}},
		"odd/key~":{}}}}}`
	defs := []engine.VMDefault{
		{Path: []any{"domain", "clock", "utc"}, Value: map[string]any{}},
		{Path: []any{"domain", "cpu", "cores"}, Value: 1.0},
		{Path: []any{"domain", "cpu", "sockets"}, Value: 2.0},
		{Path: []any{"domain", "devices", "interfaces", 0, "macAddress"}, Value: "02:00:00:00:00:01"},
		{Path: []any{"domain", "devices", "interfaces", 1, "model"}, Value: "virtio"},
		{Path: []any{"domain", "devices", "interfaces", 1, "pciAddress"}, Value: "0000:01:00.0"},
		{Path: []any{"domain", "firmware", "uuid"}, Value: "u"},
		{Path: []any{"domain", "firmware", "serial"}, Value: "s"},
		{Path: []any{"domain", "machine", "type"}, Value: "q35"},
		{Path: []any{"odd/key~", "x"}, Value: true},
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(original), &obj); err != nil {
		t.Fatal(err)
	}
	spec := nested(obj, specPaths["VirtualMachine"]).(map[string]any)
	fields, patch, err := apply(spec, specPaths["VirtualMachine"], defs)
	if err != nil {
		t.Fatal(err)
	}
	if len(fields) != len(defs) || fields[3] != "spec.template.spec.domain.devices.interfaces[0].macAddress" {
		t.Errorf("fields %v", fields)
	}
	// One operation per object or field added: clock.utc, cpu.cores, cpu.sockets, the MAC, the
	// null interface, firmware, machine, the odd key's x.
	if len(patch) != 8 {
		t.Errorf("%d operations, want 8: %v", len(patch), patch)
	}
	raw, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := p.Apply([]byte(original))
	if err != nil {
		t.Fatalf("apply %s: %v", raw, err)
	}
	want, _ := json.Marshal(obj)
	var got, defaulted any
	json.Unmarshal(patched, &got)
	json.Unmarshal(want, &defaulted)
	if !reflect.DeepEqual(got, defaulted) {
		t.Errorf("the patch gives\n%s\nwant\n%s", patched, want)
	}
}

func TestApplyNothingIsAnEmptyPatch(t *testing.T) {
	_, patch, err := apply(map[string]any{}, specPaths["VirtualMachineInstance"], nil)
	if err != nil || patch == nil || len(patch) != 0 {
		t.Errorf("patch %#v, err %v: want an empty patch", patch, err)
	}
}

func TestApplyNeverOverridesAField(t *testing.T) {
	spec := map[string]any{"domain": map[string]any{"machine": map[string]any{"type": "pc"}}}
	if _, _, err := apply(spec, specPaths["VirtualMachineInstance"], []engine.VMDefault{{Path: []any{"domain", "machine", "type"}, Value: "q35"}}); err == nil {
		t.Error("a set field was overridden")
	}
}
