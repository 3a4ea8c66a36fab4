package engine

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// VMDefaultsPlan is the vm.defaults decision's first half (seed 004): what the throwaway
// libvirt is asked to define for one VM, with dummy sources for its abstract volumes and
// networks and stably derived MACs and firmware UUID. Field paths are relative to the
// VirtualMachineInstance spec (domain.memory.guest).
type VMDefaultsPlan struct {
	// Errors are invalid input: nothing is defined.
	Errors []FieldError `json:"errors"`
	// Unsupported are valid input this defaulting cannot handle (a volume source it has no
	// dummy for).
	Unsupported []FieldError `json:"unsupported"`
	// Warnings are what is left to the node the VM starts on (host devices): the domain is
	// defined without them and nothing is written for them.
	Warnings     []FieldError  `json:"warnings"`
	FirmwareUUID string        `json:"firmware_uuid"`
	Domain       PlannedDomain `json:"domain"`
	// Revision is the bundle revision that planned; VMDefaults uses the same bundle.
	Revision string `json:"-"`
	// Generation tells which activation of the bundle planned (see VMShape).
	Generation uint64 `json:"-"`

	gen  *generation
	spec *ast.Term
	term *ast.Term
	// What else the mapping reads as the plan did: the object and its references.
	object, instancetype, preference *ast.Term
}

// PlannedDomain is the guest-visible part of the domain to define. The libvirt mechanics
// render it as XML and add a unique name and UUID per request.
type PlannedDomain struct {
	// Arch is libvirt's name of the guest's architecture: x86_64, aarch64.
	Arch      string `json:"arch"`
	Machine   string `json:"machine"`
	MemoryKiB uint64 `json:"memory_kib"`
	VCPUs     uint   `json:"vcpus"`
	// VCPUsCurrent, when not 0, is how many of VCPUs are enabled at boot (CPU hotplug);
	// VCPUsHotpluggableFrom is the first vCPU that may be unplugged.
	VCPUsCurrent          uint `json:"vcpus_current"`
	VCPUsHotpluggableFrom uint `json:"vcpus_hotpluggable_from"`
	Topology              struct {
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
	// Memballoon is "none" for no balloon, "" for libvirt's default, else the model;
	// MemballoonFreePageReporting is "on", "off" or "" (libvirt's default).
	Memballoon                  string `json:"memballoon"`
	MemballoonFreePageReporting string `json:"memballoon_free_page_reporting"`
	RNG                         bool   `json:"rng"`
	// RNGModel is the RNG's model; "" means virtio.
	RNGModel string `json:"rng_model"`
	// Video is the video card, nil for none.
	Video *PlannedVideo `json:"video"`
	// SerialConsole adds a serial port (and its console) on port 0.
	SerialConsole bool `json:"serial_console"`
	// Channels are the names of virtio channels (org.qemu.guest_agent.0).
	Channels []string       `json:"channels"`
	Watchdog *PlannedDevice `json:"watchdog"`
	Sound    *PlannedDevice `json:"sound"`
}

// PlannedVideo is a video card; VRAM (KiB) and Heads of 0 are libvirt's defaults.
type PlannedVideo struct {
	Model string `json:"model"`
	VRAM  uint   `json:"vram"`
	Heads uint   `json:"heads"`
}

// PlannedDevice is a device of a model (a watchdog's with its action).
type PlannedDevice struct {
	Model  string `json:"model"`
	Action string `json:"action"`
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
	// Model is the disk's model (virtio-non-transitional); "" is libvirt's default.
	Model string `json:"model"`
}

// PlannedInterface is one NIC; Alias (ua-net<i>) leads back to the spec's interfaces[i].
type PlannedInterface struct {
	Alias     string        `json:"alias"`
	MAC       string        `json:"mac"`
	Model     string        `json:"model"`
	PCI       string        `json:"pci"`
	BootOrder uint          `json:"boot_order"`
	Source    PlannedSource `json:"source"`
	// ROMDisabled turns the NIC's option ROM off.
	ROMDisabled bool `json:"rom_disabled"`
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

// VMCluster is what the vm.defaults rules read of the cluster a VM is defaulted for: its
// KubeVirt CR (the configuration KubeVirt's mutating webhook defaults VMs from). The zero
// VMCluster, or nil, is a cluster with KubeVirt's built-in configuration.
type VMCluster struct {
	term   *ast.Term
	digest [sha256.Size]byte
}

// NewVMCluster reads a KubeVirt CR (as decoded JSON; nil for none). Only its spec and
// status.defaultArchitecture are kept (input.kubevirt of the rules).
func NewVMCluster(kubevirt map[string]any) (*VMCluster, error) {
	c := &VMCluster{term: ast.NullTerm()}
	if kubevirt != nil {
		// Of the status, only what the rules read: the rest (conditions, their times,
		// generations) changes on its own and would change the digest with it.
		kept := map[string]any{"spec": kubevirt["spec"]}
		if status, ok := kubevirt["status"].(map[string]any); ok && status["defaultArchitecture"] != nil {
			kept["status"] = map[string]any{"defaultArchitecture": status["defaultArchitecture"]}
		}
		v, err := ast.InterfaceToValue(kept)
		if err != nil {
			return nil, fmt.Errorf("KubeVirt CR: %w", err)
		}
		c.term = ast.NewTerm(v)
	}
	text, err := c.term.AppendText(nil)
	if err != nil {
		return nil, fmt.Errorf("KubeVirt CR: %w", err)
	}
	c.digest = sha256.Sum256(text)
	return c, nil
}

func (c *VMCluster) kubevirtTerm() *ast.Term {
	if c == nil || c.term == nil {
		return ast.NullTerm()
	}
	return c.term
}

// builtinCluster is the cluster of KubeVirt's built-in configuration (a nil VMCluster).
var builtinCluster, _ = NewVMCluster(nil)

// Digest identifies the cluster's configuration: defaults for equal digests are equal.
func (c *VMCluster) Digest() [sha256.Size]byte {
	if c == nil || c.term == nil {
		return builtinCluster.digest
	}
	return c.digest
}

// VMContext is where an object is defaulted: its cluster, its namespace's UID (what makes the
// object's derived firmware UUID and MACs its own in this cluster: the same namespace/name in
// another cluster gets others), and the request creating it (an object without a name yet,
// generateName, derives them from the request).
type VMContext struct {
	Cluster      *VMCluster
	NamespaceUID string
	Request      string
	// Instancetype and Preference are what a VirtualMachine's spec.instancetype and
	// spec.preference refer to, as found; nil for a VM without one (or one not found: the
	// rules then refuse the VM, naming the reference).
	Instancetype, Preference *VMReference
}

// VMReference is an instancetype or preference of a VirtualMachine as found: the object its
// spec names, or the ControllerRevision it is pinned to (Revision, the revision's name), and
// the spec KubeVirt applies from it.
type VMReference struct {
	Kind     string         `json:"kind"`
	Name     string         `json:"name"`
	Revision string         `json:"revision,omitempty"`
	Spec     map[string]any `json:"spec"`
}

func orNull(t *ast.Term) *ast.Term {
	if t == nil {
		return ast.NullTerm()
	}
	return t
}

// term is the reference as the rules read it (input.instancetype, input.preference).
func (r *VMReference) term() (*ast.Term, error) {
	if r == nil {
		return ast.NullTerm(), nil
	}
	spec, err := mapTerm(r.Spec)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.Kind, r.Name, err)
	}
	return ast.ObjectTerm(item("kind", ast.StringTerm(r.Kind)), item("name", ast.StringTerm(r.Name)),
		item("revision", ast.StringTerm(r.Revision)), item("spec", spec)), nil
}

// Machines are the machine types (names and aliases) a QEMU supports, by KubeVirt
// architecture: amd64, arm64.
type Machines map[string][]string

// PlanVMDefaults plans the defaulting of the VM or VMI object whose VirtualMachineInstance
// spec is spec, on a QEMU that supports machines.
func (e *Engine) PlanVMDefaults(ctx context.Context, object, spec map[string]any, machines Machines) (*VMDefaultsPlan, error) {
	return e.PlanVMDefaultsIn(ctx, object, spec, machines, VMContext{})
}

// PlanVMDefaultsFor is PlanVMDefaults where request identifies the request creating the
// object: an object without a name yet (generateName) derives its MACs and UUID from it.
func (e *Engine) PlanVMDefaultsFor(ctx context.Context, object, spec map[string]any, machines Machines, request string) (*VMDefaultsPlan, error) {
	return e.PlanVMDefaultsIn(ctx, object, spec, machines, VMContext{Request: request})
}

// PlanVMDefaultsIn is PlanVMDefaults for an object defaulted in vc.
func (e *Engine) PlanVMDefaultsIn(ctx context.Context, object, spec map[string]any, machines Machines, vc VMContext) (*VMDefaultsPlan, error) {
	objTerm, specTerm, err := objectTerms(object, spec)
	if err != nil {
		return nil, fmt.Errorf("vm defaults plan: %w", err)
	}
	byArch := ast.NewObject()
	for arch, list := range machines {
		names := make([]*ast.Term, len(list))
		for i, m := range list {
			names[i] = ast.StringTerm(m)
		}
		byArch.Insert(ast.StringTerm(arch), ast.ArrayTerm(names...))
	}
	itTerm, err := vc.Instancetype.term()
	if err != nil {
		return nil, fmt.Errorf("vm defaults plan: instancetype: %w", err)
	}
	prefTerm, err := vc.Preference.term()
	if err != nil {
		return nil, fmt.Errorf("vm defaults plan: preference: %w", err)
	}
	g := e.active.Load()
	input := ast.NewObject(item("object", objTerm), item("spec", specTerm), item("machines", ast.NewTerm(byArch)),
		item("request", ast.StringTerm(vc.Request)), item("namespace_uid", ast.StringTerm(vc.NamespaceUID)),
		item("kubevirt", vc.Cluster.kubevirtTerm()), item("instancetype", itTerm), item("preference", prefTerm))
	t, err := g.eval(ctx, entryVMDefaultsPlan, input)
	if err != nil {
		return nil, err
	}
	p := &VMDefaultsPlan{Revision: g.revision, Generation: g.id, gen: g, spec: specTerm, term: t,
		object: objTerm, instancetype: itTerm, preference: prefTerm}
	if err := readPlan(t, p); err != nil {
		return nil, fmt.Errorf("decode %s: %w", entryVMDefaultsPlan, err)
	}
	return p, nil
}

// VMShape is the vm.defaults.shape decision for one object: what its defaults depend on
// (the digest of its shape spec: its spec as far as the rules read it) and the defaults that
// are its own (from its namespace and name, or generateName and request: firmware UUID, MACs).
// A bundle that has the rule promises that, for one kind and the same machine types, objects
// with equal shape digests get equal defaults but their identity defaults.
type VMShape struct {
	Digest           [sha256.Size]byte
	IdentityDefaults []VMDefault
	// Generation tells which activation of the bundle answered: each activation has its own,
	// even two of one revision. Answers of one generation may be combined, never across.
	Generation uint64
}

// VMShape evaluates the vm.defaults.shape decision for the object of PlanVMDefaultsFor. A
// bundle without the rule answers an error wrapping ErrMissingDecision.
func (e *Engine) VMShape(ctx context.Context, object, spec map[string]any, request string) (*VMShape, error) {
	return e.VMShapeIn(ctx, object, spec, VMContext{Request: request})
}

// VMShapeIn is VMShape for the object of PlanVMDefaultsIn. The digest covers the object's
// shape only: a cache of defaults by shape keys them by the cluster's Digest too.
func (e *Engine) VMShapeIn(ctx context.Context, object, spec map[string]any, vc VMContext) (*VMShape, error) {
	objTerm, specTerm, err := objectTerms(object, spec)
	if err != nil {
		return nil, fmt.Errorf("vm shape: %w", err)
	}
	g := e.active.Load()
	input := ast.NewObject(item("object", objTerm), item("spec", specTerm), item("request", ast.StringTerm(vc.Request)),
		item("namespace_uid", ast.StringTerm(vc.NamespaceUID)), item("kubevirt", vc.Cluster.kubevirtTerm()))
	t, err := g.eval(ctx, entryVMShape, input)
	if err != nil {
		return nil, err
	}
	top, ok := t.Value.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("decode %s: want an object, got %s", entryVMShape, ast.ValueName(t.Value))
	}
	shapeSpec := top.Get(ast.InternedTerm("spec"))
	ids := top.Get(ast.InternedTerm("identity_defaults"))
	if shapeSpec == nil || ids == nil {
		return nil, fmt.Errorf("decode %s: want spec and identity_defaults", entryVMShape)
	}
	out := &VMShape{Generation: g.id}
	if out.IdentityDefaults, err = vmDefaultsOf(ids); err != nil {
		return nil, fmt.Errorf("decode %s.identity_defaults: %w", entryVMShape, err)
	}
	// Objects' keys are sorted in a term's text: equal texts, equal values.
	text, err := shapeSpec.AppendText(nil)
	if err != nil {
		return nil, fmt.Errorf("decode %s.spec: %w", entryVMShape, err)
	}
	out.Digest = sha256.Sum256(text)
	return out, nil
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
	input := ast.NewObject(item("spec", plan.spec), item("plan", plan.term), item("domain", domTerm),
		item("object", orNull(plan.object)), item("instancetype", orNull(plan.instancetype)), item("preference", orNull(plan.preference)))
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

// objectTerms are what identifies an object and its VirtualMachineInstance spec, as terms.
func objectTerms(object, spec map[string]any) (objTerm, specTerm *ast.Term, err error) {
	if objTerm, err = mapTerm(object); err != nil {
		return nil, nil, err
	}
	if specTerm, err = mapTerm(spec); err != nil {
		return nil, nil, err
	}
	return objTerm, specTerm, nil
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

// jsonValueOf is v as encoding/json decodes its JSON into an any (a pool plan's VMs, the
// defaults' values).
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
		err := x.Iter(func(k, value *ast.Term) error {
			key, ok := k.Value.(ast.String)
			if !ok {
				return fmt.Errorf("object key %v is no string", k)
			}
			e, err := jsonValueOf(value.Value)
			if err != nil {
				return err
			}
			out[string(key)] = e
			return nil
		})
		return out, err
	}
	// Sets and anything else: as JSON, the way decode reads them.
	var out any
	if err := decode(ast.NewTerm(v), &out); err != nil {
		return nil, err
	}
	return out, nil
}

// planReader reads a plan straight from its Rego value, as encoding/json would from its JSON:
// a missing key or null leaves the zero value, a value of the wrong type is an error (the
// first one is kept, naming its path).
type planReader struct{ err error }

func (r *planReader) fail(path, want string, v ast.Value) {
	if r.err == nil {
		r.err = fmt.Errorf("%s: want %s, got %s", path, want, ast.ValueName(v))
	}
}

// field is obj[key], nil when missing or null.
func (r *planReader) field(obj ast.Object, key string) ast.Value {
	if obj == nil {
		return nil
	}
	t := obj.Get(ast.InternedTerm(key))
	if t == nil {
		return nil
	}
	if _, null := t.Value.(ast.Null); null {
		return nil
	}
	return t.Value
}

func (r *planReader) object(obj ast.Object, key, path string) ast.Object {
	v := r.field(obj, key)
	if v == nil {
		return nil
	}
	o, ok := v.(ast.Object)
	if !ok {
		r.fail(path+key, "an object", v)
	}
	return o
}

func (r *planReader) list(obj ast.Object, key, path string) *ast.Array {
	v := r.field(obj, key)
	if v == nil {
		return nil
	}
	a, ok := v.(*ast.Array)
	if !ok {
		r.fail(path+key, "a list", v)
	}
	return a
}

func (r *planReader) string(obj ast.Object, key, path string) string {
	v := r.field(obj, key)
	if v == nil {
		return ""
	}
	s, ok := v.(ast.String)
	if !ok {
		r.fail(path+key, "a string", v)
	}
	return string(s)
}

func (r *planReader) bool(obj ast.Object, key, path string) bool {
	v := r.field(obj, key)
	if v == nil {
		return false
	}
	b, ok := v.(ast.Boolean)
	if !ok {
		r.fail(path+key, "a boolean", v)
	}
	return bool(b)
}

func (r *planReader) uint(obj ast.Object, key, path string) uint64 {
	v := r.field(obj, key)
	if v == nil {
		return 0
	}
	n, ok := v.(ast.Number)
	if !ok {
		r.fail(path+key, "a number", v)
		return 0
	}
	u, err := strconv.ParseUint(string(n), 10, 64)
	if err != nil {
		r.fail(path+key, "a whole number of 0 or more", v)
	}
	return u
}

// objects calls f with every element of obj[key], which must be objects, and tells whether
// there is a list (an empty list decodes to an empty slice, not nil).
func (r *planReader) objects(obj ast.Object, key, path string, f func(o ast.Object, path string)) bool {
	list := r.list(obj, key, path)
	if list == nil {
		return false
	}
	for i := range list.Len() {
		p := fmt.Sprintf("%s%s[%d].", path, key, i)
		o, ok := list.Elem(i).Value.(ast.Object)
		if !ok {
			r.fail(strings.TrimSuffix(p, "."), "an object", list.Elem(i).Value)
			continue
		}
		f(o, p)
	}
	return true
}

// emptyIfNil makes a list present but empty an empty slice.
func emptyIfNil[T any](s []T, present bool) []T {
	if present && s == nil {
		return []T{}
	}
	return s
}

func (r *planReader) fieldErrors(obj ast.Object, key string) []FieldError {
	var out []FieldError
	present := r.objects(obj, key, "", func(o ast.Object, p string) {
		out = append(out, FieldError{Field: r.string(o, "field", p), Message: r.string(o, "message", p)})
	})
	return emptyIfNil(out, present)
}

func (r *planReader) source(obj ast.Object, path string) PlannedSource {
	o := r.object(obj, "source", path)
	return PlannedSource{Type: r.string(o, "type", path+"source."), Path: r.string(o, "path", path+"source.")}
}

func (r *planReader) device(obj ast.Object, key, path string) *PlannedDevice {
	o := r.object(obj, key, path)
	if o == nil {
		return nil
	}
	return &PlannedDevice{Model: r.string(o, "model", path+key+"."), Action: r.string(o, "action", path+key+".")}
}

// readPlan fills p from the plan's value t.
func readPlan(t *ast.Term, p *VMDefaultsPlan) error {
	top, ok := t.Value.(ast.Object)
	if !ok {
		return fmt.Errorf("want an object, got %s", ast.ValueName(t.Value))
	}
	r := &planReader{}
	p.Errors = r.fieldErrors(top, "errors")
	p.Unsupported = r.fieldErrors(top, "unsupported")
	p.Warnings = r.fieldErrors(top, "warnings")
	p.FirmwareUUID = r.string(top, "firmware_uuid", "")
	dom := r.object(top, "domain", "")
	d := &p.Domain
	const dp = "domain."
	d.Arch = r.string(dom, "arch", dp)
	d.Machine = r.string(dom, "machine", dp)
	d.MemoryKiB = r.uint(dom, "memory_kib", dp)
	d.VCPUs = uint(r.uint(dom, "vcpus", dp))
	d.VCPUsCurrent = uint(r.uint(dom, "vcpus_current", dp))
	d.VCPUsHotpluggableFrom = uint(r.uint(dom, "vcpus_hotpluggable_from", dp))
	topo := r.object(dom, "topology", dp)
	d.Topology.Sockets = uint(r.uint(topo, "sockets", dp+"topology."))
	d.Topology.Cores = uint(r.uint(topo, "cores", dp+"topology."))
	d.Topology.Threads = uint(r.uint(topo, "threads", dp+"topology."))
	d.CPUModel = r.string(dom, "cpu_model", dp)
	if clock := r.object(dom, "clock", dp); clock != nil {
		d.Clock = &struct {
			Offset   string `json:"offset"`
			Timezone string `json:"timezone"`
		}{Offset: r.string(clock, "offset", dp+"clock."), Timezone: r.string(clock, "timezone", dp+"clock.")}
	}
	present := r.objects(dom, "disks", dp, func(o ast.Object, path string) {
		d.Disks = append(d.Disks, PlannedDisk{
			Alias: r.string(o, "alias", path), Device: r.string(o, "device", path),
			Bus: r.string(o, "bus", path), Dev: r.string(o, "dev", path),
			Source: r.source(o, path), ReadOnly: r.bool(o, "readonly", path),
			PCI: r.string(o, "pci", path), BootOrder: uint(r.uint(o, "boot_order", path)),
			Serial: r.string(o, "serial", path), Model: r.string(o, "model", path),
		})
	})
	d.Disks = emptyIfNil(d.Disks, present)
	present = r.objects(dom, "interfaces", dp, func(o ast.Object, path string) {
		d.Interfaces = append(d.Interfaces, PlannedInterface{
			Alias: r.string(o, "alias", path), MAC: r.string(o, "mac", path),
			Model: r.string(o, "model", path), PCI: r.string(o, "pci", path),
			BootOrder: uint(r.uint(o, "boot_order", path)), Source: r.source(o, path),
			ROMDisabled: r.bool(o, "rom_disabled", path),
		})
	})
	d.Interfaces = emptyIfNil(d.Interfaces, present)
	present = r.objects(dom, "inputs", dp, func(o ast.Object, path string) {
		d.Inputs = append(d.Inputs, PlannedInput{Alias: r.string(o, "alias", path), Type: r.string(o, "type", path), Bus: r.string(o, "bus", path)})
	})
	d.Inputs = emptyIfNil(d.Inputs, present)
	present = r.objects(dom, "controllers", dp, func(o ast.Object, path string) {
		d.Controllers = append(d.Controllers, PlannedController{
			Type: r.string(o, "type", path), Index: uint(r.uint(o, "index", path)), Model: r.string(o, "model", path),
		})
	})
	d.Controllers = emptyIfNil(d.Controllers, present)
	d.Memballoon = r.string(dom, "memballoon", dp)
	d.MemballoonFreePageReporting = r.string(dom, "memballoon_free_page_reporting", dp)
	d.RNG = r.bool(dom, "rng", dp)
	d.RNGModel = r.string(dom, "rng_model", dp)
	if video := r.object(dom, "video", dp); video != nil {
		d.Video = &PlannedVideo{
			Model: r.string(video, "model", dp+"video."), VRAM: uint(r.uint(video, "vram", dp+"video.")),
			Heads: uint(r.uint(video, "heads", dp+"video.")),
		}
	}
	d.SerialConsole = r.bool(dom, "serial_console", dp)
	if list := r.list(dom, "channels", dp); list != nil {
		for i := range list.Len() {
			name, ok := list.Elem(i).Value.(ast.String)
			if !ok {
				r.fail(fmt.Sprintf("%schannels[%d]", dp, i), "a string", list.Elem(i).Value)
				continue
			}
			d.Channels = append(d.Channels, string(name))
		}
	}
	d.Watchdog = r.device(dom, "watchdog", dp)
	d.Sound = r.device(dom, "sound", dp)
	return r.err
}
