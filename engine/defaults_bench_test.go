package engine

import (
	"context"
	"encoding/json"
	"os"
	"testing"
)

// BenchmarkVMDefaults is the rules' share of defaulting one VM: the plan, and the mapping of
// the domain libvirt 9.0 defined for it (testdata/vmdefaults-domain.xml, recorded) back into
// the VM; for a VM of a shape seen before, its shape alone. libvirt's share and the whole are measured in defaults/.
func BenchmarkVMDefaults(b *testing.B) {
	e, err := New(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	// The VM libvirt defined testdata/vmdefaults-domain.xml for.
	var vm struct{ Object, Spec map[string]any }
	raw, err := os.ReadFile("testdata/vmdefaults-vm.json")
	if err == nil {
		err = json.Unmarshal(raw, &vm)
	}
	if err != nil {
		b.Fatal(err)
	}
	object, spec := vm.Object, vm.Spec
	machines := Machines{"amd64": {"pc", "q35", "pc-q35-7.2", "pc-i440fx-7.2"}}
	b.Run("plan", func(b *testing.B) {
		for b.Loop() {
			p, err := e.PlanVMDefaults(context.Background(), object, spec, machines)
			if err != nil || len(p.Errors) > 0 {
				b.Fatal(err, p.Errors)
			}
		}
	})
	// What a VM of a shape seen before costs the rules (the defaulter's shape cache).
	b.Run("shape", func(b *testing.B) {
		for b.Loop() {
			shape, err := e.VMShape(context.Background(), object, spec, "")
			if err != nil || len(shape.IdentityDefaults) != 2 {
				b.Fatal(err, shape)
			}
		}
	})
	domain, err := os.ReadFile("testdata/vmdefaults-domain.xml")
	if err != nil {
		b.Fatal(err)
	}
	plan, err := e.PlanVMDefaults(context.Background(), object, spec, machines)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("mapping", func(b *testing.B) {
		for b.Loop() {
			d, err := e.VMDefaults(context.Background(), plan, domain)
			if err != nil || len(d) == 0 {
				b.Fatal(err, d)
			}
		}
	})
}
