// Package defaults fills in, ahead of time, every guest-visible value libvirt would otherwise
// choose on the host (seed 004): a VirtualMachine or VirtualMachineInstance is planned by the
// vm.defaults rules, defined in an isolated throwaway libvirt, read back and undefined, and
// the rules map what libvirt chose into the object's own unset fields.
//
// The Rego rules decide; this package does the XML and libvirt mechanics. The libvirt side
// (libvirt.go) needs cgo and the build tag libvirt; everything else builds without it.
package defaults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
)

// Hypervisor is the isolated, throwaway libvirt the defaults are asked of.
type Hypervisor interface {
	// DefineAndRead defines domain under a name and UUID of its own, returns its inactive
	// XML and undefines it, whatever happens. A *RefusedError is libvirt refusing the domain;
	// ErrUnavailable wraps every failure to reach libvirt at all.
	DefineAndRead(ctx context.Context, domain *libvirtxml.Domain) ([]byte, error)
	// Machines are the machine types (aliases included) of the probed QEMU, by architecture.
	Machines() engine.Machines
}

// ErrUnavailable means libvirt cannot be reached: not (yet) connected, or the connection broke.
var ErrUnavailable = errors.New("libvirt unavailable")

// ErrNoLibvirt is what every libvirt operation answers in a binary built without libvirt.
var ErrNoLibvirt = errors.New("this virt-rules was built without libvirt: build with -tags libvirt (make build does when libvirt-dev is installed)")

// RefusedError is libvirt refusing a domain; Message is libvirt's.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return "libvirt refused the domain: " + e.Message }

// Cause types, as Kubernetes names them in a Status.
const (
	CauseInvalid      = string(metav1.CauseTypeFieldValueInvalid)
	CauseNotSupported = string(metav1.CauseTypeFieldValueNotSupported)
)

// Cause is one field at fault; Field is a path in the object (spec.template.spec.domain...).
type Cause struct {
	Type    string
	Field   string
	Message string
}

// BadRequestError is a request that is no VirtualMachine or VirtualMachineInstance at all.
type BadRequestError struct{ Message string }

func (e *BadRequestError) Error() string { return e.Message }

// InvalidError is an object that cannot be defaulted: invalid fields, fields this defaulting
// does not support, or a domain libvirt refused (Libvirt holds libvirt's message).
type InvalidError struct {
	Object  string // Kind namespace/name
	Causes  []Cause
	Libvirt string
}

func (e *InvalidError) Error() string {
	parts := make([]string, 0, len(e.Causes))
	for _, c := range e.Causes {
		parts = append(parts, c.Field+": "+c.Message)
	}
	return e.Object + ": " + strings.Join(parts, "; ")
}

// Unsupported tells whether every cause is a field this defaulting does not support: the
// object is valid, it just cannot be defaulted here.
func (e *InvalidError) Unsupported() bool {
	return len(e.Causes) > 0 && !slices.ContainsFunc(e.Causes, func(c Cause) bool { return c.Type != CauseNotSupported })
}

// Defaulter defaults objects with the vm.defaults rules of Engine and libvirt Hypervisor.
type Defaulter struct {
	Engine     *engine.Engine
	Hypervisor Hypervisor
	// Shapes, when set and Hypervisor is an Epocher (a Cache), keeps defaults by shape.
	Shapes *ShapeCache
	// Cluster is the cluster objects are defaulted for (its KubeVirt configuration); nil is
	// KubeVirt's built-in configuration.
	Cluster *engine.VMCluster
	// Finder finds the instancetypes and preferences VirtualMachines refer to, where Options
	// do not give them; nil finds none (the rules then refuse such a VM, naming the reference).
	Finder Finder
}

// Options say where one object is defaulted.
type Options struct {
	// Request identifies the request creating the object (an admission request's UID): an
	// object without a name yet derives its MACs and firmware UUID from it instead of from its
	// spec, so that objects created from one template differ.
	Request string
	// NamespaceUID is the UID of the object's namespace: derived values are then this
	// cluster's own (the same namespace/name in another cluster gets others). Without it
	// (offline), they derive from the namespace's name.
	NamespaceUID string
	// Instancetype and Preference are a VirtualMachine's, found by the caller (the admission
	// webhook reads them from the cluster); when both are nil, the Defaulter's Finder finds
	// them.
	Instancetype, Preference *engine.VMReference
}

// Result is a defaulted object.
type Result struct {
	// Object is the whole object, defaulted, as JSON.
	Object []byte
	// Patch is the RFC 6902 JSON patch from the object given to Object.
	Patch []jsonpatch.Operation
	// Defaults are the fields set, as paths in the object.
	Defaults []string
	// Warnings name what is left to the node the object starts on (host devices), each
	// "field: why", the field a path in the object: nothing is written for them.
	Warnings []string
	// Subject names the object, "Kind namespace/name" (name* for a generateName), as
	// InvalidError.Object does.
	Subject string
}

// The kinds defaulted, and where their VirtualMachineInstance spec is.
var specPaths = map[string][]string{
	"VirtualMachine":         {"spec", "template", "spec"},
	"VirtualMachineInstance": {"spec"},
}

// Default defaults raw, a VirtualMachine or VirtualMachineInstance as JSON.
func (d *Defaulter) Default(ctx context.Context, raw []byte) (*Result, error) {
	return d.DefaultFor(ctx, raw, "")
}

// DefaultFor is Default where request identifies the request creating the object (an
// admission request's UID): an object without a name yet derives its MACs and firmware UUID
// from it instead of from its spec, so that objects created from one template differ.
func (d *Defaulter) DefaultFor(ctx context.Context, raw []byte, request string) (*Result, error) {
	return d.defaultFor(ctx, raw, Options{Request: request}, true)
}

// DefaultWith is Default with opts.
func (d *Defaulter) DefaultWith(ctx context.Context, raw []byte, opts Options) (*Result, error) {
	return d.defaultFor(ctx, raw, opts, true)
}

// defaultFor is DefaultWith; without whole, the Result has no Object (a dry run needs only
// the patch).
func (d *Defaulter) defaultFor(ctx context.Context, raw []byte, opts Options, whole bool) (*Result, error) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, &BadRequestError{Message: fmt.Sprintf("the body is no JSON object: %v", err)}
	}
	kind, _ := obj["kind"].(string)
	apiVersion, _ := obj["apiVersion"].(string)
	specPath, ok := specPaths[kind]
	if !ok || apiVersion != kubevirtv1.GroupVersion.String() {
		return nil, &BadRequestError{Message: fmt.Sprintf("apiVersion %q kind %q: want %s VirtualMachine or VirtualMachineInstance", apiVersion, kind, kubevirtv1.GroupVersion)}
	}
	name := describe(obj)
	if err := checkTypes(kind, raw); err != nil {
		return nil, &InvalidError{Object: name, Causes: []Cause{*err}}
	}
	spec, ok := nested(obj, specPath).(map[string]any)
	if !ok {
		return nil, &InvalidError{Object: name, Causes: []Cause{{Type: CauseInvalid, Field: strings.Join(specPath, "."), Message: "required"}}}
	}
	prefix := strings.Join(specPath, ".") + "."
	// Only what identifies the object: annotations may be large and are never read.
	m, _ := obj["metadata"].(map[string]any)
	meta := map[string]any{"kind": kind, "metadata": map[string]any{
		"namespace": m["namespace"], "name": m["name"], "generateName": m["generateName"],
	}}
	// A VM's instancetype and preference change its guest: the rules must know of them.
	if vmSpec, ok := obj["spec"].(map[string]any); ok && kind == "VirtualMachine" {
		refs := map[string]any{}
		for _, k := range []string{"instancetype", "preference"} {
			if vmSpec[k] != nil {
				refs[k] = vmSpec[k]
			}
		}
		if len(refs) > 0 {
			meta["spec"] = refs
		}
	}
	vc := engine.VMContext{Cluster: d.Cluster, NamespaceUID: opts.NamespaceUID, Request: opts.Request,
		Instancetype: opts.Instancetype, Preference: opts.Preference}
	if _, refs := meta["spec"]; refs && vc.Instancetype == nil && vc.Preference == nil && d.Finder != nil {
		it, pref, causes, err := References(ctx, d.Finder, obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(causes) > 0 {
			return nil, &InvalidError{Object: name, Causes: causes}
		}
		vc.Instancetype, vc.Preference = it, pref
	}
	defs, warnings, revision, err := d.defaults(ctx, name, kind, meta, spec, prefix, vc)
	if err != nil {
		return nil, err
	}
	res := &Result{Subject: name}
	for _, w := range warnings {
		res.Warnings = append(res.Warnings, objectField(prefix, w.Field)+": "+w.Message)
	}
	if res.Defaults, res.Patch, err = apply(spec, specPath, defs); err != nil {
		return nil, fmt.Errorf("%s: bundle %s: %w", name, revision, err)
	}
	if !whole {
		return res, nil
	}
	if res.Object, err = json.Marshal(obj); err != nil {
		return nil, fmt.Errorf("%s: encode: %w", name, err)
	}
	return res, nil
}

// apply sets defs in spec, the object's VirtualMachineInstance spec at specPath, and returns
// the fields set (paths in the object) and the RFC 6902 JSON patch from the object as it was:
// one operation per field or object the defaults added, with its value as it ends up (an
// "add", or a "replace" of a list item that was null: "add" would insert one).
func apply(spec map[string]any, specPath []string, defs []engine.VMDefault) ([]string, []jsonpatch.Operation, error) {
	prefix := strings.Join(specPath, ".") + "."
	var fields []string
	// Where the defaults added a field or object, outermost first, and whether it is a list
	// item appended to its list.
	type addition struct {
		path     []any
		appended bool
	}
	var added []addition
	for _, def := range defs {
		field, root, appended, err := set(spec, def.Path, def.Value)
		if err != nil {
			return nil, nil, err
		}
		fields = append(fields, prefix+field)
		if !slices.ContainsFunc(added, func(a addition) bool { return isPrefix(a.path, root) }) {
			added = append(added, addition{root, appended})
		}
	}
	patch := []jsonpatch.Operation{} // nothing to default: an empty patch, not none
	for _, a := range added {
		op := "add"
		if _, item := a.path[len(a.path)-1].(int); item && !a.appended {
			op = "replace"
		}
		patch = append(patch, jsonpatch.Operation{Operation: op, Path: pointer(specPath, a.path), Value: valueAt(spec, a.path)})
	}
	return fields, patch, nil
}

// isPrefix tells whether path starts with prefix.
func isPrefix(prefix, path []any) bool {
	return len(prefix) <= len(path) && slices.Equal(prefix, path[:len(prefix)])
}

var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// pointer is the RFC 6901 JSON pointer of path (in the spec at specPath) in the object.
func pointer(specPath []string, path []any) string {
	var b strings.Builder
	token := func(s string) {
		b.WriteByte('/')
		if strings.ContainsAny(s, "~/") {
			s = pointerEscape.Replace(s)
		}
		b.WriteString(s)
	}
	for _, step := range specPath {
		token(step)
	}
	for _, step := range path {
		if i, ok := step.(int); ok {
			token(strconv.Itoa(i))
		} else {
			token(step.(string))
		}
	}
	return b.String()
}

// valueAt is the value at path (keys and list indexes, all there) in spec.
func valueAt(spec map[string]any, path []any) any {
	var cur any = spec
	for _, step := range path {
		switch s := step.(type) {
		case string:
			cur = cur.(map[string]any)[s]
		case int:
			cur = cur.([]any)[s]
		}
	}
	return cur
}

// defaults are the defaults of the object meta whose VirtualMachineInstance spec is spec, what
// they leave to the node, and the bundle revision that gave them: from the shape cache when
// it has them, else evaluated (and kept there when they can be).
func (d *Defaulter) defaults(ctx context.Context, name, kind string, meta, spec map[string]any, prefix string, vc engine.VMContext) ([]engine.VMDefault, []engine.FieldError, string, error) {
	machines := d.Hypervisor.Machines()
	var shape *engine.VMShape
	var key shapeKey
	if epocher, cacheable := d.Hypervisor.(Epocher); d.Shapes != nil && cacheable {
		// Without the rule (a bundle may leave it out) or with an error in it, the object is
		// evaluated in full, which reports whatever is wrong with it.
		var err error
		if shape, err = d.Engine.VMShapeIn(ctx, meta, spec, vc); err != nil {
			d.Shapes.bypass()
			shape = nil
		} else {
			key = keyOf(shape.Digest, vc.Cluster.Digest(), shape.Generation, epocher.Epoch(ctx), kind, machines)
			if defs, warnings, revision, ok := d.Shapes.get(key, shape.IdentityDefaults); ok {
				return defs, warnings, revision, nil
			}
		}
	}
	defs, plan, err := d.evaluate(ctx, name, meta, spec, machines, prefix, vc)
	if err != nil {
		return nil, nil, "", err
	}
	switch {
	case shape == nil:
	case plan.Generation == shape.Generation:
		d.Shapes.put(key, plan.Revision, defs, plan.Warnings, shape.IdentityDefaults)
	default:
		d.Shapes.bypass() // a bundle activated in between
	}
	return defs, plan.Warnings, plan.Revision, nil
}

// evaluate plans the object's domain, has libvirt define it, and maps libvirt's answer back.
func (d *Defaulter) evaluate(ctx context.Context, name string, meta, spec map[string]any, machines engine.Machines, prefix string, vc engine.VMContext) ([]engine.VMDefault, *engine.VMDefaultsPlan, error) {
	plan, err := d.Engine.PlanVMDefaultsIn(ctx, meta, spec, machines, vc)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(plan.Errors)+len(plan.Unsupported) > 0 {
		e := &InvalidError{Object: name}
		for _, f := range plan.Errors {
			e.Causes = append(e.Causes, Cause{Type: CauseInvalid, Field: objectField(prefix, f.Field), Message: f.Message})
		}
		for _, f := range plan.Unsupported {
			e.Causes = append(e.Causes, Cause{Type: CauseNotSupported, Field: objectField(prefix, f.Field), Message: f.Message})
		}
		return nil, nil, e
	}
	dom, err := domainOf(&plan.Domain)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	xml, err := d.Hypervisor.DefineAndRead(ctx, dom)
	var refused *RefusedError
	if errors.As(err, &refused) {
		return nil, nil, &InvalidError{Object: name, Libvirt: refused.Message, Causes: blame(spec, prefix, refused.Message)}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	defs, err := d.Engine.VMDefaults(ctx, plan, xml)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return defs, plan, nil
}

// objectField is the path in the object of field, a path in the VirtualMachineInstance spec
// at prefix; a field of the object itself (spec.instancetype of a VM: a VirtualMachineInstance
// spec has no spec or metadata) is kept as it is.
func objectField(prefix, field string) string {
	if strings.HasPrefix(field, "spec.") || strings.HasPrefix(field, "metadata.") {
		return field
	}
	return prefix + field
}

// checkTypes decodes raw into KubeVirt's Go type, so that a field of the wrong type is an
// error naming it.
func checkTypes(kind string, raw []byte) *Cause {
	var target any = &kubevirtv1.VirtualMachine{}
	if kind == "VirtualMachineInstance" {
		target = &kubevirtv1.VirtualMachineInstance{}
	}
	err := json.Unmarshal(raw, target)
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return &Cause{Type: CauseInvalid, Field: typeErr.Field, Message: fmt.Sprintf("%s is not a valid %s", typeErr.Value, typeErr.Type)}
	}
	// A value whose own decoding failed (a quantity such as "lots") carries no path: find it.
	var doc any
	if json.Unmarshal(raw, &doc) == nil {
		if field, value, ok := badQuantity(doc, reflect.TypeOf(target).Elem(), ""); ok {
			return &Cause{Type: CauseInvalid, Field: field, Message: fmt.Sprintf("%q is not a quantity (such as 1Gi, 500m or 2)", value)}
		}
	}
	return &Cause{Type: CauseInvalid, Field: "spec", Message: err.Error()}
}

var quantityType = reflect.TypeOf(resource.Quantity{})

// badQuantity walks doc (decoded JSON) along t, the Go type it decodes into, and returns the
// path of the first value of a resource.Quantity field that does not parse, and that value.
func badQuantity(doc any, t reflect.Type, path string) (field, value string, ok bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == quantityType {
		if s, isString := doc.(string); isString {
			if _, err := resource.ParseQuantity(s); err != nil {
				return path, s, true
			}
		}
		return "", "", false
	}
	join := func(key string) string {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, isObject := doc.(map[string]any)
		if !isObject {
			return "", "", false
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" && f.Anonymous {
				if field, value, ok := badQuantity(doc, f.Type, path); ok {
					return field, value, ok
				}
				continue
			}
			if v, present := obj[name]; present {
				if field, value, ok := badQuantity(v, f.Type, join(name)); ok {
					return field, value, ok
				}
			}
		}
	case reflect.Map:
		obj, isObject := doc.(map[string]any)
		if !isObject {
			return "", "", false
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if field, value, ok := badQuantity(obj[k], t.Elem(), join(k)); ok {
				return field, value, ok
			}
		}
	case reflect.Slice, reflect.Array:
		list, isList := doc.([]any)
		if !isList {
			return "", "", false
		}
		for i, v := range list {
			if field, value, ok := badQuantity(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); ok {
				return field, value, ok
			}
		}
	}
	return "", "", false
}

func describe(obj map[string]any) string {
	kind, _ := obj["kind"].(string)
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	if name == "" {
		gen, _ := meta["generateName"].(string)
		name = gen + "*"
	}
	if ns != "" {
		return kind + " " + ns + "/" + name
	}
	return kind + " " + name
}

func nested(obj map[string]any, path []string) any {
	var cur any = obj
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

// set sets the unset field at path (keys and list indexes) of spec to value, creating the
// objects on the way, and returns the path as text and the part of path that was added: the
// first object it created (a list item appended at the end of a list, appended true), or else
// the field. A field already set is an error: user values are never overridden, whatever a
// bundle says.
func set(spec map[string]any, path []any, value any) (string, []any, bool, error) {
	var field strings.Builder
	var added []any
	appended := false
	var cur any = spec
	for i, step := range path {
		last := i == len(path)-1
		switch s := step.(type) {
		case string:
			if field.Len() > 0 {
				field.WriteByte('.')
			}
			field.WriteString(s)
			m, ok := cur.(map[string]any)
			if !ok {
				return "", nil, false, fmt.Errorf("default for %s: not an object on the way", field.String())
			}
			if last {
				if m[s] != nil {
					return "", nil, false, fmt.Errorf("default for %s: the field is set; user values are never overridden", field.String())
				}
				m[s] = value
				if added == nil {
					added = path
				}
				return field.String(), added, appended, nil
			}
			if m[s] == nil {
				if _, list := path[i+1].(int); list {
					m[s] = []any{}
				} else {
					m[s] = map[string]any{}
				}
				if added == nil {
					added = path[:i+1]
				}
			}
			// A list item one past the end is appended (what KubeVirt adds: a disk for a
			// volume without one, its default pod interface); the list is put back.
			if next, item := path[i+1].(int); item {
				if l, ok := m[s].([]any); ok && next == len(l) {
					m[s] = append(l, map[string]any{})
					if added == nil {
						added, appended = path[:i+2], true
					}
				}
			}
			cur = m[s]
		case int:
			field.WriteString("[" + strconv.Itoa(s) + "]")
			l, ok := cur.([]any)
			if !ok || s < 0 || s >= len(l) || last {
				return "", nil, false, fmt.Errorf("default for %s: no such list item", field.String())
			}
			if l[s] == nil {
				l[s] = map[string]any{}
				if added == nil {
					added = path[:i+1]
				}
			}
			cur = l[s]
		default:
			return "", nil, false, fmt.Errorf("default path %v: step %v is neither key nor index", path, step)
		}
	}
	return "", nil, false, fmt.Errorf("default with an empty path")
}

// blame names the fields whose values libvirt's message quotes (a model, a machine type, a
// PCI address); when none, the whole spec.
func blame(spec map[string]any, prefix, msg string) []Cause {
	var causes []Cause
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				p := k
				if path != "" {
					p = path + "." + k
				}
				walk(c, p)
			}
		case []any:
			for i, c := range x {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		case string:
			if x != "" && (strings.Contains(msg, "'"+x+"'") || (len(x) >= 6 && strings.Contains(msg, x))) {
				causes = append(causes, Cause{Type: CauseInvalid, Field: prefix + path, Message: msg})
			}
		}
	}
	walk(spec, "")
	if len(causes) == 0 {
		return []Cause{{Type: CauseInvalid, Field: strings.TrimSuffix(prefix, "."), Message: msg}}
	}
	slices.SortFunc(causes, func(a, b Cause) int { return strings.Compare(a.Field, b.Field) })
	return causes
}
