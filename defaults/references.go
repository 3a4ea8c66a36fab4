package defaults

import (
	"context"
	"fmt"

	"github.com/virt-rules/virt-rules/engine"
)

// The kinds a VirtualMachine's spec.instancetype and spec.preference name (their API group is
// instancetype.kubevirt.io), and the kind each defaults to (KubeVirt's: the cluster-wide one).
const (
	KindInstancetype        = "VirtualMachineInstancetype"
	KindClusterInstancetype = "VirtualMachineClusterInstancetype"
	KindPreference          = "VirtualMachinePreference"
	KindClusterPreference   = "VirtualMachineClusterPreference"
	// KindControllerRevision (apps/v1) holds the instancetype or preference a VM is pinned to
	// (spec.instancetype.revisionName): KubeVirt stores the whole object in its data.
	KindControllerRevision = "ControllerRevision"
	// InstancetypeGroup is the API group of the four kinds.
	InstancetypeGroup = "instancetype.kubevirt.io"
)

// A Finder gets an object a VirtualMachine refers to: an instancetype or preference of one of
// the four kinds, or a ControllerRevision. namespace is "" for the cluster-wide kinds. A
// missing object is (nil, nil); an error is a failure to look.
type Finder interface {
	Find(ctx context.Context, kind, namespace, name string) (map[string]any, error)
}

// Objects is a Finder over objects at hand (offline: those among `default`'s inputs), by kind,
// namespace and name.
type Objects map[[3]string]map[string]any

// Add keeps obj (an instancetype, preference or ControllerRevision) and tells whether it is
// one.
func (o Objects) Add(obj map[string]any) bool {
	kind, _ := obj["kind"].(string)
	switch kind {
	case KindInstancetype, KindClusterInstancetype, KindPreference, KindClusterPreference, KindControllerRevision:
	default:
		return false
	}
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	if kind == KindClusterInstancetype || kind == KindClusterPreference {
		ns = ""
	} else if ns == "" {
		ns = "default"
	}
	o[[3]string{kind, ns, name}] = obj
	return true
}

// Find implements Finder.
func (o Objects) Find(_ context.Context, kind, namespace, name string) (map[string]any, error) {
	return o[[3]string{kind, namespace, name}], nil
}

// hint says where f looked, for a message about a missing object.
func hint(f Finder) string {
	if _, offline := f.(Objects); offline {
		return " among the inputs (give it with -f)"
	}
	return ""
}

// References finds what the VirtualMachine obj (decoded JSON) refers to with f: its
// instancetype and preference, each nil when it has none. A reference that names no object
// (inferFromVolume, resolved only when KubeVirt admits the VM) is left to the rules, which say
// so; one whose object is missing is a cause naming its field (spec.instancetype.name,
// spec.preference.revisionName...). The error is a failure to look.
func References(ctx context.Context, f Finder, obj map[string]any) (it, pref *engine.VMReference, causes []Cause, err error) {
	spec, _ := obj["spec"].(map[string]any)
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	if ns == "" {
		ns = "default"
	}
	find := func(ref, namespaced, cluster string) (*engine.VMReference, error) {
		m, _ := spec[ref].(map[string]any)
		name, _ := m["name"].(string)
		if m == nil || name == "" {
			return nil, nil
		}
		kind, _ := m["kind"].(string)
		if kind == "" {
			kind = cluster
		}
		if kind != namespaced && kind != cluster {
			causes = append(causes, Cause{Type: CauseNotSupported, Field: "spec." + ref + ".kind", Message: fmt.Sprintf("%q: want %s or %s", kind, cluster, namespaced)})
			return nil, nil
		}
		objNS := ns
		if kind == cluster {
			objNS = ""
		}
		if revision, _ := m["revisionName"].(string); revision != "" {
			cr, err := f.Find(ctx, KindControllerRevision, ns, revision)
			if err != nil {
				return nil, fmt.Errorf("spec.%s.revisionName: get ControllerRevision %s/%s: %w", ref, ns, revision, err)
			}
			if cr == nil {
				causes = append(causes, Cause{Type: CauseInvalid, Field: "spec." + ref + ".revisionName", Message: fmt.Sprintf("ControllerRevision %s/%s, the %s the VM is pinned to, does not exist%s", ns, revision, ref, hint(f))})
				return nil, nil
			}
			stored, err := revisionObject(cr)
			if err != nil {
				causes = append(causes, Cause{Type: CauseInvalid, Field: "spec." + ref + ".revisionName", Message: fmt.Sprintf("ControllerRevision %s/%s: %v", ns, revision, err)})
				return nil, nil
			}
			s, _ := stored["spec"].(map[string]any)
			return &engine.VMReference{Kind: kind, Name: name, Revision: revision, Spec: s}, nil
		}
		o, err := f.Find(ctx, kind, objNS, name)
		if err != nil {
			return nil, fmt.Errorf("spec.%s.name: get %s %s: %w", ref, kind, name, err)
		}
		if o == nil {
			where := name
			if objNS != "" {
				where = objNS + "/" + name
			}
			causes = append(causes, Cause{Type: CauseInvalid, Field: "spec." + ref + ".name", Message: fmt.Sprintf("%s %s does not exist%s", kind, where, hint(f))})
			return nil, nil
		}
		s, ok := o["spec"].(map[string]any)
		if !ok {
			causes = append(causes, Cause{Type: CauseInvalid, Field: "spec." + ref + ".name", Message: fmt.Sprintf("%s %s has no spec", kind, name)})
			return nil, nil
		}
		return &engine.VMReference{Kind: kind, Name: name, Spec: s}, nil
	}
	if it, err = find("instancetype", KindInstancetype, KindClusterInstancetype); err != nil {
		return nil, nil, nil, err
	}
	if pref, err = find("preference", KindPreference, KindClusterPreference); err != nil {
		return nil, nil, nil, err
	}
	return it, pref, causes, nil
}

// revisionObject is the instancetype or preference a ControllerRevision holds: KubeVirt stores
// the whole object as the revision's data.
func revisionObject(cr map[string]any) (map[string]any, error) {
	data, _ := cr["data"].(map[string]any)
	if _, ok := data["spec"].(map[string]any); !ok {
		return nil, fmt.Errorf("data holds no instancetype or preference spec")
	}
	return data, nil
}
