//go:build virtrules_oracle

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	k8sv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/api/migrations"
	migrationsv1 "kubevirt.io/api/migrations/v1alpha1"

	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-controller/watch/migration"
)

// namespaceNameLabel is the label kube-apiserver gives every Namespace, set to its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// matchLine is migration-policy's answer for one VirtualMachineInstance.
type matchLine struct {
	Source    string `json:"source"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Policy is the name of the MigrationPolicy virt-controller's matchPolicy chooses; null
	// when none matches (or when Error is set).
	Policy *string  `json:"policy"`
	Notes  []string `json:"notes"`
	Error  string   `json:"error,omitempty"`
}

func migrationPolicyCmd(args []string, stdin io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("migration-policy", flag.ContinueOnError)
	kvFile := fs.String("kubevirt", "", "YAML of the KubeVirt CR whose configuration the cluster has (default: an empty spec, status.defaultArchitecture -arch)")
	arch := addArchFlag(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("migration-policy: %w", err)
	}
	return eachDocument("migration-policy", fs.Args(), *kvFile, string(*arch), stdin, out, func(c *cluster, docs []document) (func(document) any, error) {
		s, err := c.policyCluster(docs)
		if err != nil {
			return nil, err
		}
		return s.answer, nil
	})
}

// policyCluster is what virt-controller's migration controller sees: the MigrationPolicies
// kube-apiserver stored (those virt-api's admitter admitted, first of each name) and the
// Namespaces.
type policyCluster struct {
	c          *cluster
	verdicts   map[string]admitLine // by source
	stored     migrationsv1.MigrationPolicyList
	namespaces map[string]*k8sv1.Namespace
	nsSources  map[string]string // namespace -> the source of the document that defined it
}

func isMigrationPolicy(d document) bool {
	return d.obj.GetAPIVersion() == migrationsv1.SchemeGroupVersion.String() && d.obj.GetKind() == migrationsv1.MigrationPolicyKind.Kind
}

func isNamespace(d document) bool {
	return d.obj.GetAPIVersion() == "v1" && d.obj.GetKind() == "Namespace"
}

func isVMI(d document) bool {
	gv := d.obj.GetAPIVersion()
	return (gv == v1.GroupVersion.String() || gv == v1.GroupVersion.Group+"/v1alpha3") &&
		d.obj.GetKind() == v1.VirtualMachineInstanceGroupVersionKind.Kind
}

// policyCluster admits every MigrationPolicy of docs and reads every Namespace, in order.
func (c *cluster) policyCluster(docs []document) (*policyCluster, error) {
	admitter, err := newMigrationPolicyAdmitter(c.config)
	if err != nil {
		return nil, err
	}
	s := &policyCluster{c: c, verdicts: map[string]admitLine{}, namespaces: map[string]*k8sv1.Namespace{}, nsSources: map[string]string{}}
	names := map[string]string{} // stored policy name -> source
	for _, d := range docs {
		switch {
		case isMigrationPolicy(d):
			line, policy := c.admitPolicy(admitter, d)
			if policy != nil {
				if first, dup := names[policy.Name]; dup {
					f := false
					line.Allowed = &f
					line.Message = fmt.Sprintf("%s.%s %q already exists", migrations.ResourceMigrationPolicies, migrations.GroupName, policy.Name)
					line.Notes = append(line.Notes, "refused by kube-apiserver: "+first+" created a MigrationPolicy of this name first")
					policy = nil
				}
			}
			if policy != nil {
				names[policy.Name] = d.source
				s.stored.Items = append(s.stored.Items, *policy)
			}
			s.verdicts[d.source] = line
		case isNamespace(d):
			ns, err := storedAs[k8sv1.Namespace](d)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", d.source, err)
			}
			if _, dup := s.namespaces[ns.Name]; !dup {
				s.namespaces[ns.Name], s.nsSources[ns.Name] = withNameLabel(ns), d.source
			}
		}
	}
	return s, nil
}

// answer is the line for one document: the admitter's verdict for a MigrationPolicy, the
// policy matchPolicy chooses for a VirtualMachineInstance, a skipped line for anything else.
func (s *policyCluster) answer(d document) any {
	kind, ns, name := d.kindOf()
	switch {
	case isMigrationPolicy(d):
		return s.verdicts[d.source]
	case isVMI(d):
		line := matchLine{Source: d.source, Kind: kind, Namespace: ns, Name: name, Notes: []string{}}
		err := s.c.traced(kind, ns, name, &line.Notes, func() error { return s.match(d, &line) })
		if err != nil {
			line.Policy = nil
			line.Error = err.Error()
		}
		return line
	default:
		line := admitLine{Source: d.source, Kind: kind, Namespace: ns, Name: name, Causes: []cause{}, Warnings: []string{}, Notes: []string{}, Skipped: true}
		switch {
		case isNamespace(d) && s.nsSources[name] == d.source:
			line.Notes = append(line.Notes, "read: the Namespace of its VirtualMachineInstances")
		case isNamespace(d):
			line.Notes = append(line.Notes, fmt.Sprintf("ignored: %s defines Namespace %s first (kube-apiserver refuses a second)", s.nsSources[name], name))
		default:
			line.Notes = append(line.Notes, fmt.Sprintf("skipped: %s %s is not a MigrationPolicy, VirtualMachineInstance or Namespace", d.obj.GetAPIVersion(), kind))
		}
		return line
	}
}

// match runs virt-controller's matchPolicy for the VMI of d, with every stored policy and the
// VMI's Namespace, as its migration controller does when a migration of the VMI starts.
func (s *policyCluster) match(d document, line *matchLine) error {
	vmi, err := storedAs[v1.VirtualMachineInstance](d)
	if err != nil {
		return err
	}
	if vmi.Namespace == "" {
		vmi.Namespace = "default"
	}
	line.Namespace = vmi.Namespace
	ns, ok := s.namespaces[vmi.Namespace]
	if !ok {
		line.Notes = append(line.Notes, fmt.Sprintf("Namespace %s is not among the inputs: read as kube-apiserver creates it, with only the label %s", vmi.Namespace, namespaceNameLabel))
		ns = withNameLabel(&k8sv1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmi.Namespace}})
	}
	return safely("virt-controller's matchPolicy", func() error {
		// matchPolicy reads the list and copies the policy it returns.
		if p := migration.MatchPolicy(&s.stored, vmi, ns.DeepCopy()); p != nil {
			name := p.Name
			line.Policy = &name
		}
		return nil
	})
}

// storedAs decodes d as virt-controller's informers get it from kube-apiserver: through JSON
// of the typed object, so that an empty labels map (omitted when stored) reads as none (nil).
func storedAs[T any](d document) (*T, error) {
	raw, err := d.obj.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	obj := new(T)
	if err := json.Unmarshal(raw, obj); err != nil {
		return nil, fmt.Errorf("decode as %s %s: %w", d.obj.GetAPIVersion(), d.obj.GetKind(), err)
	}
	stored, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	out := new(T)
	if err := json.Unmarshal(stored, out); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return out, nil
}

// withNameLabel gives ns the label kube-apiserver sets on every Namespace (its name, whatever
// value was sent).
func withNameLabel(ns *k8sv1.Namespace) *k8sv1.Namespace {
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[namespaceNameLabel] = ns.Name
	return ns
}

// newMigrationPolicyAdmitter is virt-api's MigrationPolicy admitter. Its constructor takes the
// cluster configuration from v1.9 on (for the MigrationStallDetection feature gate), none
// before.
func newMigrationPolicyAdmitter(config *virtconfig.ClusterConfig) (*admitters.MigrationPolicyAdmitter, error) {
	switch newAdmitter := any(admitters.NewMigrationPolicyAdmitter).(type) {
	case func() *admitters.MigrationPolicyAdmitter:
		return newAdmitter(), nil
	case func(*virtconfig.ClusterConfig) *admitters.MigrationPolicyAdmitter:
		return newAdmitter(config), nil
	default:
		return nil, fmt.Errorf("virt-api's NewMigrationPolicyAdmitter has an unknown signature %T", newAdmitter)
	}
}

// admitPolicy runs virt-api's MigrationPolicy validating webhook on the create of d, and
// returns its line and, when admitted, the policy as stored.
func (c *cluster) admitPolicy(admitter *admitters.MigrationPolicyAdmitter, d document) (admitLine, *migrationsv1.MigrationPolicy) {
	kind, _, name := d.kindOf()
	line := admitLine{Source: d.source, Kind: kind, Name: name, Causes: []cause{}, Warnings: []string{}, Notes: []string{}}
	var stored *migrationsv1.MigrationPolicy
	err := c.traced(kind, "", name, &line.Notes, func() error {
		raw, err := policyAsCreated(d, &line.Notes)
		if err != nil {
			return err
		}
		var resp *admissionv1.AdmissionResponse
		if err := safely("virt-api's MigrationPolicy admitter", func() error {
			resp = admitter.Admit(context.Background(), policyReview(name, raw))
			return nil
		}); err != nil {
			return err
		}
		if resp == nil {
			return errors.New("virt-api's MigrationPolicy admitter gave no answer")
		}
		line.answer(resp)
		if !resp.Allowed {
			return nil
		}
		stored = &migrationsv1.MigrationPolicy{}
		if err := json.Unmarshal(raw, stored); err != nil {
			return fmt.Errorf("decode the admitted MigrationPolicy: %w", err)
		}
		return nil
	})
	if err != nil {
		line.Allowed = new(bool)
		line.Error = err.Error()
		stored = nil
	}
	return line, stored
}

// policyAsCreated is d as kube-apiserver passes a create of it to the validating webhooks: a
// cluster-scoped object (no namespace), with a uid derived from its name.
func policyAsCreated(d document, notes *[]string) ([]byte, error) {
	o := d.obj.DeepCopy()
	if o.GetName() == "" {
		return nil, errors.New("kube-apiserver refuses the MigrationPolicy: metadata.name is required")
	}
	if ns := o.GetNamespace(); ns != "" {
		*notes = append(*notes, fmt.Sprintf("metadata.namespace %s dropped: MigrationPolicies are cluster-scoped", ns))
		o.SetNamespace("")
	}
	o.SetUID(types.UID("virt-rules-oracle-migrationpolicy-" + o.GetName()))
	o.SetGeneration(1)
	raw, err := o.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode the MigrationPolicy: %w", err)
	}
	return bytes.TrimSpace(raw), nil
}

// policyReview is the AdmissionReview kube-apiserver sends virt-api for a create of the
// MigrationPolicy raw.
func policyReview(name string, raw []byte) *admissionv1.AdmissionReview {
	gvk := migrationsv1.MigrationPolicyKind
	kind := metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind}
	gvr := metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: migrations.ResourceMigrationPolicies}
	dryRun := false
	return &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:             types.UID("virt-rules-oracle-review-" + strings.ToLower(name)),
			Kind:            kind,
			Resource:        gvr,
			RequestKind:     &kind,
			RequestResource: &gvr,
			Name:            name,
			Operation:       admissionv1.Create,
			UserInfo:        authenticationv1.UserInfo{Username: userName, Groups: []string{"system:authenticated"}},
			Object:          runtime.RawExtension{Raw: raw},
			DryRun:          &dryRun,
			Options:         runtime.RawExtension{Raw: []byte(`{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}`)},
		},
	}
}
