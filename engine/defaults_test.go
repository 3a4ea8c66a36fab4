package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
)

// The mapping half of vm.defaults on a domain libvirt 9.0 defined for the plan of a VM
// (recorded in testdata), so it runs without libvirt; test/defaults runs both halves on a
// real libvirt.
func TestVMDefaultsMapsARecordedDomain(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The VM libvirt defined testdata/vmdefaults-domain.xml for.
	var vm struct{ Object, Spec map[string]any }
	raw, err := os.ReadFile("testdata/vmdefaults-vm.json")
	if err == nil {
		err = json.Unmarshal(raw, &vm)
	}
	if err != nil {
		t.Fatal(err)
	}
	object, spec := vm.Object, vm.Spec
	plan, err := e.PlanVMDefaults(ctx, object, spec, engine.Machines{"amd64": {"q35", "pc"}})
	if err != nil || len(plan.Errors) > 0 {
		t.Fatal(err, plan.Errors)
	}
	domain, err := os.ReadFile("testdata/vmdefaults-domain.xml")
	if err != nil {
		t.Fatal(err)
	}
	defs, err := e.VMDefaults(ctx, plan, domain)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, d := range defs {
		got[fmt.Sprint(d.Path)] = d.Value
	}
	want := map[string]any{
		"[domain devices interfaces 0 model]":      "virtio",
		"[domain devices interfaces 0 macAddress]": plan.Domain.Interfaces[0].MAC,
		"[domain devices disks 0 disk bus]":        "sata",
		"[domain devices disks 1 cdrom bus]":       "sata",
		"[domain devices disks 1 cdrom readonly]":  true,
		"[domain firmware uuid]":                   plan.FirmwareUUID,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, ok := got["[domain machine type]"]; ok {
		t.Errorf("the user's machine type q35 was overridden: %v", got["[domain machine type]"])
	}
	for k, v := range got {
		if s, ok := v.(string); ok && (s == "/usr/bin/qemu-system-x86_64" || len(s) > 3 && s[:3] == "ua-") {
			t.Errorf("backend-only value %s = %s", k, s)
		}
	}
	shape, err := e.VMShape(ctx, object, spec, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(shape.IdentityDefaults) != 2 || shape.Generation != plan.Generation {
		t.Errorf("identity defaults %v of generation %d, want the MAC and firmware UUID of generation %d", shape.IdentityDefaults, shape.Generation, plan.Generation)
	}
	for _, id := range shape.IdentityDefaults {
		if got[fmt.Sprint(id.Path)] != id.Value {
			t.Errorf("identity default %v = %v, the mapping says %v", id.Path, id.Value, got[fmt.Sprint(id.Path)])
		}
	}
	if _, err := e.VMDefaults(ctx, plan, []byte("<domain><unclosed>")); err == nil {
		t.Error("malformed domain XML: no error")
	}
	if _, err := e.VMDefaults(ctx, nil, domain); !errors.Is(err, engine.ErrMalformedInput) {
		t.Errorf("no plan: got %v, want ErrMalformedInput", err)
	}
}

// Every activation is a generation of its own, even of the same bundle: answers of one are
// never combined with another's.
func TestGenerationsDifferPerActivation(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.WithBundlePath("../rego"))
	if err != nil {
		t.Fatal(err)
	}
	object := map[string]any{"metadata": map[string]any{"name": "vm", "namespace": "demo"}}
	first, err := e.VMShape(ctx, object, map[string]any{}, "")
	if err != nil {
		t.Fatal(err)
	}
	revision := e.Revision()
	if err := e.LoadPath(ctx, "../rego"); err != nil {
		t.Fatal(err)
	}
	second, err := e.VMShape(ctx, object, map[string]any{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if e.Revision() != revision || first.Generation == second.Generation {
		t.Errorf("revisions %s and %s, generations %d and %d: want one revision, two generations", revision, e.Revision(), first.Generation, second.Generation)
	}
}
