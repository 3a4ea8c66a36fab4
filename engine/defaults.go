package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// VMDefaultsPlan is the vm.defaults decision's first half (seed 004): what the throwaway
// libvirt is asked to define for one VM, with dummy sources for its abstract volumes and
// networks and stably derived MACs and firmware UUID. Field paths are relative to the
// VirtualMachineInstance spec (domain.memory.guest).
type VMDefaultsPlan struct {
	// Errors are invalid input: nothing is defined.
	Errors []FieldError `json:"errors"`
	// Unsupported are valid input this defaulting cannot handle (a passthrough device).
	Unsupported  []FieldError  `json:"unsupported"`
	FirmwareUUID string        `json:"firmware_uuid"`
	Domain       PlannedDomain `json:"domain"`
	// Revision is the bundle revision that planned; VMDefaults uses the same bundle.
	Revision string `json:"-"`

	gen  *generation
	spec *ast.Term
	term *ast.Term
}

// PlannedDomain is the guest-visible part of the domain to define. The libvirt mechanics
// render it as XML and add a unique name and UUID per request.
type PlannedDomain struct {
	Machine   string `json:"machine"`
	MemoryKiB uint64 `json:"memory_kib"`
	VCPUs     uint   `json:"vcpus"`
	Topology  struct {
		Sockets uint `json:"sockets"`
		Cores   uint `json:"cores"`
		Threads uint `json:"threads"`
	} `json:"topology"`
	CPUModel string `json:"cpu_model"`
	Clock    *struct {
		Offset   string `json:"offset"`
		Timezone string `json:"timezone"`
	} `json:"clock"`
	Disks       []PlannedDisk       `json:"disks"`
	Interfaces  []PlannedInterface  `json:"interfaces"`
	Inputs      []PlannedInput      `json:"inputs"`
	Controllers []PlannedController `json:"controllers"`
	// Memballoon is "none" for no balloon, "" for libvirt's default.
	Memballoon string `json:"memballoon"`
	RNG        bool   `json:"rng"`
}

// PlannedSource is a dummy backend: type "file", "block" or "ethernet".
type PlannedSource struct {
	Type string `json:"type"`
	Path string `json:"path"`
}

// PlannedDisk is one disk; Alias (ua-disk<i>) leads back to the spec's disks[i].
type PlannedDisk struct {
	Alias     string        `json:"alias"`
	Device    string        `json:"device"` // disk, cdrom or lun
	Bus       string        `json:"bus"`
	Dev       string        `json:"dev"`
	Source    PlannedSource `json:"source"`
	ReadOnly  bool          `json:"readonly"`
	PCI       string        `json:"pci"`
	BootOrder uint          `json:"boot_order"`
	Serial    string        `json:"serial"`
}

// PlannedInterface is one NIC; Alias (ua-net<i>) leads back to the spec's interfaces[i].
type PlannedInterface struct {
	Alias     string        `json:"alias"`
	MAC       string        `json:"mac"`
	Model     string        `json:"model"`
	PCI       string        `json:"pci"`
	BootOrder uint          `json:"boot_order"`
	Source    PlannedSource `json:"source"`
}

// PlannedInput is one input device; Alias (ua-input<i>) leads back to the spec's inputs[i].
type PlannedInput struct {
	Alias string `json:"alias"`
	Type  string `json:"type"`
	Bus   string `json:"bus"`
}

// PlannedController is a controller KubeVirt's own domain converter would add.
type PlannedController struct {
	Type  string `json:"type"`
	Index uint   `json:"index"`
	Model string `json:"model"`
}

// VMDefault is one value for a field the user left unset: Path is a list of keys (string) and
// list indexes (int) into the VirtualMachineInstance spec.
type VMDefault struct {
	Path  []any `json:"path"`
	Value any   `json:"value"`
}

// PlanVMDefaults plans the defaulting of the VM or VMI object whose VirtualMachineInstance
// spec is spec, on a QEMU that supports machines (machine type names and aliases).
func (e *Engine) PlanVMDefaults(ctx context.Context, object, spec map[string]any, machines []string) (*VMDefaultsPlan, error) {
	return e.PlanVMDefaultsFor(ctx, object, spec, machines, "")
}

// PlanVMDefaultsFor is PlanVMDefaults where request identifies the request creating the
// object: an object without a name yet (generateName) derives its MACs and UUID from it.
func (e *Engine) PlanVMDefaultsFor(ctx context.Context, object, spec map[string]any, machines []string, request string) (*VMDefaultsPlan, error) {
	objTerm, err := mapTerm(object)
	if err != nil {
		return nil, fmt.Errorf("vm defaults plan: %w", err)
	}
	specTerm, err := mapTerm(spec)
	if err != nil {
		return nil, fmt.Errorf("vm defaults plan: %w", err)
	}
	names := make([]*ast.Term, len(machines))
	for i, m := range machines {
		names[i] = ast.StringTerm(m)
	}
	g := e.active.Load()
	input := ast.NewObject(item("object", objTerm), item("spec", specTerm), item("machines", ast.ArrayTerm(names...)), item("request", ast.StringTerm(request)))
	t, err := g.eval(ctx, entryVMDefaultsPlan, input)
	if err != nil {
		return nil, err
	}
	p := &VMDefaultsPlan{Revision: g.revision, gen: g, spec: specTerm, term: t}
	if err := decode(t, p); err != nil {
		return nil, fmt.Errorf("decode %s: %w", entryVMDefaultsPlan, err)
	}
	return p, nil
}

// VMDefaults maps the domain libvirt defined for plan (its inactive XML) back into values for
// the spec's unset fields. It uses the bundle generation that made the plan.
func (e *Engine) VMDefaults(ctx context.Context, plan *VMDefaultsPlan, domainXML []byte) ([]VMDefault, error) {
	if plan == nil || plan.gen == nil {
		return nil, fmt.Errorf("vm defaults: %w: no plan from PlanVMDefaults", ErrMalformedInput)
	}
	domTerm, err := xmlTerm(domainXML)
	if err != nil {
		return nil, fmt.Errorf("vm defaults: %w", err)
	}
	input := ast.NewObject(item("spec", plan.spec), item("plan", plan.term), item("domain", domTerm))
	t, err := plan.gen.eval(ctx, entryVMDefaults, input)
	if err != nil {
		return nil, err
	}
	out, err := vmDefaultsOf(t)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", entryVMDefaults, err)
	}
	return out, nil
}

func mapTerm(m map[string]any) (*ast.Term, error) {
	if m == nil {
		return ast.NullTerm(), nil
	}
	v, err := ast.InterfaceToValue(m)
	if err != nil {
		return nil, err
	}
	return ast.NewTerm(v), nil
}

// vmDefaultsOf reads the mapping's answer, a list of {"path", "value"}, straight from its
// Rego value: the values as encoding/json would decode them (numbers as float64), the path's
// numbers as list indexes.
func vmDefaultsOf(t *ast.Term) ([]VMDefault, error) {
	list, ok := t.Value.(*ast.Array)
	if !ok {
		return nil, fmt.Errorf("want a list, got %v", ast.ValueName(t.Value))
	}
	out := make([]VMDefault, 0, list.Len())
	for i := range list.Len() {
		obj, ok := list.Elem(i).Value.(ast.Object)
		if !ok {
			return nil, fmt.Errorf("[%d]: want an object", i)
		}
		path, ok := obj.Get(ast.InternedTerm("path")).Value.(*ast.Array)
		if !ok {
			return nil, fmt.Errorf("[%d].path: want a list", i)
		}
		d := VMDefault{Path: make([]any, path.Len())}
		for j := range path.Len() {
			switch step := path.Elem(j).Value.(type) {
			case ast.String:
				d.Path[j] = string(step)
			case ast.Number:
				n, ok := step.Int()
				if !ok {
					return nil, fmt.Errorf("[%d].path[%d]: %v is no list index", i, j, step)
				}
				d.Path[j] = n
			default:
				return nil, fmt.Errorf("[%d].path[%d]: want a key or a list index, got %v", i, j, ast.ValueName(step))
			}
		}
		value := obj.Get(ast.InternedTerm("value"))
		if value == nil {
			return nil, fmt.Errorf("[%d].value: missing", i)
		}
		var err error
		if d.Value, err = jsonValueOf(value.Value); err != nil {
			return nil, fmt.Errorf("[%d].value: %w", i, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// jsonValueOf is v as encoding/json decodes its JSON into an any.
func jsonValueOf(v ast.Value) (any, error) {
	switch x := v.(type) {
	case ast.Null:
		return nil, nil
	case ast.Boolean:
		return bool(x), nil
	case ast.String:
		return string(x), nil
	case ast.Number:
		return strconv.ParseFloat(string(x), 64)
	case *ast.Array:
		out := make([]any, x.Len())
		for i := range x.Len() {
			e, err := jsonValueOf(x.Elem(i).Value)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case ast.Object:
		out := make(map[string]any, x.Len())
		for _, k := range x.Keys() {
			key, ok := k.Value.(ast.String)
			if !ok {
				return nil, fmt.Errorf("object key %v is no string", k)
			}
			e, err := jsonValueOf(x.Get(k).Value)
			if err != nil {
				return nil, err
			}
			out[string(key)] = e
		}
		return out, nil
	}
	// Sets and anything else: as JSON, the way decode reads them.
	var out any
	if err := decode(ast.NewTerm(v), &out); err != nil {
		return nil, err
	}
	return out, nil
}
