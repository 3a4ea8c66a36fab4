//go:build virtrules_oracle

package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"strings"

	"github.com/google/uuid"

	k8sv1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	v1 "kubevirt.io/api/core/v1"
	cdiclient "kubevirt.io/client-go/containerizeddataimporter"
	cdifake "kubevirt.io/client-go/containerizeddataimporter/fake"
	"kubevirt.io/client-go/kubecli"
	generatedclient "kubevirt.io/client-go/kubevirt"
	kvfake "kubevirt.io/client-go/kubevirt/fake"
	clonev1 "kubevirt.io/client-go/kubevirt/typed/clone/v1beta1"
	exportv1 "kubevirt.io/client-go/kubevirt/typed/export/v1beta1"
	instancetypev1beta1 "kubevirt.io/client-go/kubevirt/typed/instancetype/v1beta1"
	migrationsv1 "kubevirt.io/client-go/kubevirt/typed/migrations/v1alpha1"
	poolv1 "kubevirt.io/client-go/kubevirt/typed/pool/v1beta1"
	snapshotv1 "kubevirt.io/client-go/kubevirt/typed/snapshot/v1beta1"
	"kubevirt.io/client-go/log"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"kubevirt.io/kubevirt/pkg/testutils"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	operatorutil "kubevirt.io/kubevirt/pkg/virt-operator/util"
)

// defaultArch is the architecture of the test cluster's nodes and control plane; -arch models
// a cluster of another one KubeVirt builds for.
const defaultArch = "amd64"

// archFlag is -arch, the architecture of the cluster's nodes and control plane: what
// runtime.GOARCH is to virt-operator, virt-api (virt-config's ClusterConfig), virt-handler and
// virt-launcher there. KubeVirt builds its images for amd64, arm64 and s390x; the oracle models
// the first two.
type archFlag string

func (a *archFlag) String() string { return string(*a) }

func (a *archFlag) Set(s string) error {
	switch s {
	case "amd64", "arm64":
		*a = archFlag(s)
		return nil
	}
	return errors.New("want amd64 or arm64")
}

// addArchFlag adds -arch to the flags of a command that builds a cluster.
func addArchFlag(fs *flag.FlagSet) *archFlag {
	a := archFlag(defaultArch)
	fs.Var(&a, "arch", "architecture of the cluster's nodes and control plane: amd64 or arm64")
	return &a
}

// cluster is what KubeVirt's components know of the cluster: the KubeVirt CR's configuration,
// clients of an otherwise empty cluster and empty informers.
type cluster struct {
	arch            string // the nodes' and control plane's
	kv              *v1.KubeVirt
	config          *virtconfig.ClusterConfig
	client          *offlineClient
	informers       *webhooks.Informers
	namespaceStore  cache.Store
	serviceAccounts map[string]struct{} // KubeVirt's, as virt-api knows them
	logs            *logCapture
}

// newCluster builds the cluster of the KubeVirt CR in kvFile ("" for the default CR), whose
// nodes and control plane are of architecture arch.
func newCluster(kvFile, arch string) (*cluster, error) {
	logs := captureLogs()
	kv, err := loadKubeVirt(kvFile, arch)
	if err != nil {
		return nil, err
	}
	// As virt-operator leaves it once deployed; virt-config ignores a KubeVirt CR with no phase
	// and rereads only on a new resourceVersion.
	if kv.Status.Phase == "" {
		kv.Status.Phase = v1.KubeVirtPhaseDeployed
	}
	if kv.ResourceVersion == "" {
		kv.ResourceVersion = "1"
	}
	crdInformer, _ := testutils.NewFakeInformerFor(&extv1.CustomResourceDefinition{})
	kvInformer, _ := testutils.NewFakeInformerFor(&v1.KubeVirt{})
	if err := kvInformer.GetStore().Add(kv); err != nil {
		return nil, fmt.Errorf("cluster config: add the KubeVirt CR: %w", err)
	}
	// virt-api's NewClusterConfig takes its own runtime.GOARCH: the architecture whose
	// defaults (machine type, emulated machines, OVMF path) the configuration starts from.
	config, err := virtconfig.NewClusterConfigWithCPUArch(crdInformer, kvInformer, kv.Namespace, arch)
	if err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	// virt-config falls back to its defaults, logging why, when the CR's configuration is
	// invalid: an oracle must not answer for a configuration it did not take.
	config.GetConfig()
	for _, l := range logs.drain() {
		if l.level == "error" {
			return nil, fmt.Errorf("cluster config: KubeVirt rejects the configuration of KubeVirt %s/%s: %s", kv.Namespace, kv.Name, l.text)
		}
	}

	presetInformer, _ := testutils.NewFakeInformerFor(&v1.VirtualMachineInstancePreset{})
	dataSourceInformer, _ := testutils.NewFakeInformerFor(&cdiv1.DataSource{})
	namespaceInformer, _ := testutils.NewFakeInformerFor(&k8sv1.Namespace{})
	return &cluster{
		arch:   arch,
		kv:     kv,
		config: config,
		client: newOfflineClient(),
		informers: &webhooks.Informers{
			VMIPresetInformer:  presetInformer,
			DataSourceInformer: dataSourceInformer,
			NamespaceInformer:  namespaceInformer,
		},
		namespaceStore:  namespaceInformer.GetStore(),
		serviceAccounts: webhooks.KubeVirtServiceAccounts(kv.Namespace),
		logs:            logs,
	}, nil
}

// loadKubeVirt reads the first KubeVirt of file, or makes the test cluster's, as virt-operator
// leaves it on a cluster of architecture arch.
func loadKubeVirt(file, arch string) (*v1.KubeVirt, error) {
	if file == "" {
		return &v1.KubeVirt{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1.GroupVersion.String(), Kind: "KubeVirt"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: "kubevirt"},
			Status:     v1.KubeVirtStatus{DefaultArchitecture: arch},
		}, nil
	}
	docs, err := readDocuments([]string{file}, nil)
	if err != nil {
		return nil, fmt.Errorf("--kubevirt: %w", err)
	}
	for _, d := range docs {
		if d.obj.GetKind() != "KubeVirt" || !strings.HasPrefix(d.obj.GetAPIVersion(), v1.GroupVersion.Group+"/") {
			continue
		}
		raw, err := d.obj.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("--kubevirt %s: %w", d.source, err)
		}
		kv := &v1.KubeVirt{}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(kv); err != nil {
			return nil, fmt.Errorf("--kubevirt %s: not a KubeVirt this KubeVirt version knows: %w", d.source, err)
		}
		if kv.Namespace == "" {
			kv.Namespace = "kubevirt"
		}
		if kv.Status.DefaultArchitecture == "" {
			// virt-operator's choice for a cluster of arch nodes and no spec'd default (its
			// own runtime.GOARCH).
			kv.Status.DefaultArchitecture = arch
		}
		// virt-operator's SetDefaultArchitecture: a spec'd
		// architectureConfiguration.defaultArchitecture replaces the status' on every
		// reconcile; virt-config reads only the status.
		operatorutil.SetDefaultArchitecture(kv)
		return kv, nil
	}
	return nil, fmt.Errorf("--kubevirt %s: no kubevirt.io KubeVirt in it", file)
}

// offlineClient is the KubevirtClient of an empty cluster: the fake clientsets of Kubernetes,
// KubeVirt and CDI with nothing in them, which record what is asked of them. The clients
// KubeVirt's admission and start of a VM have no use for (OpenShift's, Prometheus', REST...)
// are nil: a call to one panics, which callers turn into an error naming it.
type offlineClient struct {
	*k8sfake.Clientset // kubernetes.Interface
	kubevirtOnly       // every other method of kubecli.KubevirtClient, nil
	kubevirt           *kvfake.Clientset
	cdi                *cdifake.Clientset
	lookups            []string
}

// kubevirtOnly lets offlineClient satisfy kubecli.KubevirtClient of any KubeVirt version:
// its methods come one level deeper than the fake Kubernetes clientset's, which win.
type kubevirtOnly struct{ kubecli.KubevirtClient }

var _ kubecli.KubevirtClient = &offlineClient{}

func newOfflineClient() *offlineClient {
	c := &offlineClient{
		Clientset: k8sfake.NewSimpleClientset(),
		kubevirt:  kvfake.NewSimpleClientset(),
		cdi:       cdifake.NewSimpleClientset(),
	}
	for _, f := range []*k8stesting.Fake{&c.Clientset.Fake, &c.kubevirt.Fake, &c.cdi.Fake} {
		f.PrependReactor("*", "*", c.record)
	}
	return c
}

// record notes an action on a fake clientset and lets its empty tracker answer it.
func (c *offlineClient) record(a k8stesting.Action) (bool, runtime.Object, error) {
	res := a.GetResource()
	what := res.Resource
	if res.Group != "" {
		what += "." + res.Group
	}
	if sub := a.GetSubresource(); sub != "" {
		what += "/" + sub
	}
	target := a.GetNamespace()
	if n, ok := a.(interface{ GetName() string }); ok && n.GetName() != "" {
		if target != "" {
			target += "/"
		}
		target += n.GetName()
	}
	c.lookups = append(c.lookups, fmt.Sprintf("KubeVirt asked the cluster to %s %s %s; offline, the cluster holds only the instancetypes, preferences and ControllerRevisions given",
		a.GetVerb(), what, strings.TrimSpace(target)))
	return false, nil, nil
}

// takeLookups returns the recorded lookups and forgets them.
func (c *offlineClient) takeLookups() []string {
	l := c.lookups
	c.lookups = nil
	return l
}

func (c *offlineClient) VirtualMachineInstance(ns string) kubecli.VirtualMachineInstanceInterface {
	return c.kubevirt.KubevirtV1().VirtualMachineInstances(ns)
}

func (c *offlineClient) VirtualMachineInstanceMigration(ns string) kubecli.VirtualMachineInstanceMigrationInterface {
	return c.kubevirt.KubevirtV1().VirtualMachineInstanceMigrations(ns)
}

func (c *offlineClient) ReplicaSet(ns string) kubecli.ReplicaSetInterface {
	return c.kubevirt.KubevirtV1().VirtualMachineInstanceReplicaSets(ns)
}

func (c *offlineClient) VirtualMachinePool(ns string) poolv1.VirtualMachinePoolInterface {
	return c.kubevirt.PoolV1beta1().VirtualMachinePools(ns)
}

func (c *offlineClient) VirtualMachine(ns string) kubecli.VirtualMachineInterface {
	return c.kubevirt.KubevirtV1().VirtualMachines(ns)
}

func (c *offlineClient) KubeVirt(ns string) kubecli.KubeVirtInterface {
	return c.kubevirt.KubevirtV1().KubeVirts(ns)
}

func (c *offlineClient) VirtualMachineInstancePreset(ns string) kubecli.VirtualMachineInstancePresetInterface {
	return c.kubevirt.KubevirtV1().VirtualMachineInstancePresets(ns)
}

func (c *offlineClient) VirtualMachineSnapshot(ns string) snapshotv1.VirtualMachineSnapshotInterface {
	return c.kubevirt.SnapshotV1beta1().VirtualMachineSnapshots(ns)
}

func (c *offlineClient) VirtualMachineSnapshotContent(ns string) snapshotv1.VirtualMachineSnapshotContentInterface {
	return c.kubevirt.SnapshotV1beta1().VirtualMachineSnapshotContents(ns)
}

func (c *offlineClient) VirtualMachineRestore(ns string) snapshotv1.VirtualMachineRestoreInterface {
	return c.kubevirt.SnapshotV1beta1().VirtualMachineRestores(ns)
}

func (c *offlineClient) VirtualMachineExport(ns string) exportv1.VirtualMachineExportInterface {
	return c.kubevirt.ExportV1beta1().VirtualMachineExports(ns)
}

func (c *offlineClient) VirtualMachineInstancetype(ns string) instancetypev1beta1.VirtualMachineInstancetypeInterface {
	return c.kubevirt.InstancetypeV1beta1().VirtualMachineInstancetypes(ns)
}

func (c *offlineClient) VirtualMachineClusterInstancetype() instancetypev1beta1.VirtualMachineClusterInstancetypeInterface {
	return c.kubevirt.InstancetypeV1beta1().VirtualMachineClusterInstancetypes()
}

func (c *offlineClient) VirtualMachinePreference(ns string) instancetypev1beta1.VirtualMachinePreferenceInterface {
	return c.kubevirt.InstancetypeV1beta1().VirtualMachinePreferences(ns)
}

func (c *offlineClient) VirtualMachineClusterPreference() instancetypev1beta1.VirtualMachineClusterPreferenceInterface {
	return c.kubevirt.InstancetypeV1beta1().VirtualMachineClusterPreferences()
}

func (c *offlineClient) MigrationPolicy() migrationsv1.MigrationPolicyInterface {
	return c.kubevirt.MigrationsV1alpha1().MigrationPolicies()
}

func (c *offlineClient) VirtualMachineClone(ns string) clonev1.VirtualMachineCloneInterface {
	return c.kubevirt.CloneV1beta1().VirtualMachineClones(ns)
}

func (c *offlineClient) GeneratedKubeVirtClient() generatedclient.Interface { return c.kubevirt }

func (c *offlineClient) CdiClient() cdiclient.Interface { return c.cdi }

func (c *offlineClient) DiscoveryClient() discovery.DiscoveryInterface {
	return c.Clientset.Discovery()
}

// eventRecorder is the recorder virt-controller's VM controller gets; its events are dropped
// (a FakeRecorder without a channel).
func eventRecorder() record.EventRecorder { return &record.FakeRecorder{} }

// logCapture takes KubeVirt's log lines (kubevirt.io/client-go/log, JSON a line) so that
// warnings and errors logged while handling an object go into its notes.
type logCapture struct{ buf bytes.Buffer }

type logLine struct{ level, text string }

func captureLogs() *logCapture {
	l := &logCapture{}
	log.Log.SetIOWriter(&l.buf)
	return l
}

// drain returns the warnings and errors logged since the last drain.
func (l *logCapture) drain() []logLine {
	var out []logLine
	sc := bufio.NewScanner(&l.buf)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue
		}
		level, _ := m["level"].(string)
		if level != "warning" && level != "error" && level != "fatal" {
			continue
		}
		text, _ := m["msg"].(string)
		if reason, ok := m["reason"].(string); ok && reason != "" {
			text += ": " + reason
		}
		out = append(out, logLine{level: level, text: text})
	}
	l.buf.Reset()
	return out
}

// notes turns the drained log lines into notes.
func (l *logCapture) notes() []string {
	var notes []string
	for _, line := range l.drain() {
		notes = append(notes, fmt.Sprintf("KubeVirt logged (%s): %s", line.level, line.text))
	}
	return notes
}

// safely runs f, turning a panic of KubeVirt's code (or of a nil client it reached for) into
// an error.
func safely(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: KubeVirt's code panicked (most likely it needs a client or host resource the oracle does not have offline): %v", what, r)
		}
	}()
	return f()
}

// seedUUIDs makes the random UUIDs KubeVirt's code draws while it handles one object (the
// VM mutating webhook's firmware UUID and serial, the review's uid) a function of the object's
// kind, namespace and name, so that answers, domain XML first, compare across runs.
// traced runs f for one object (kind namespace/name): with the UUIDs KubeVirt draws seeded
// from it, and the lookups KubeVirt made of the fake clients and its warning and error logs
// during f added to notes (each once).
func (c *cluster) traced(kind, namespace, name string, notes *[]string, f func() error) error {
	seedUUIDs(kind, namespace, name)
	c.logs.drain()
	c.client.takeLookups()
	err := f()
	*notes = append(*notes, c.client.takeLookups()...)
	*notes = uniq(append(*notes, c.logs.notes()...))
	return err
}

func seedUUIDs(kind, namespace, name string) {
	if namespace == "" {
		namespace = "default"
	}
	h := sha256.Sum256([]byte(kind + "/" + namespace + "/" + name))
	uuid.SetRand(rand.New(rand.NewSource(int64(binary.BigEndian.Uint64(h[:8])))))
}

// uniq sorts nothing but drops repeated notes, keeping the first.
func uniq(notes []string) []string {
	seen := map[string]bool{}
	out := make([]string, 0, len(notes))
	for _, n := range notes {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
