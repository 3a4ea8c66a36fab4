// Package live reads, from a running cluster, every object `virt-rules eval` decides for, as
// manifest.Objects: the same report code then decides for a cluster as for files. Lists are
// paged (limit/continue), each page's bytes count against one budget, as manifest.ReadLimited
// counts files, and every request is bounded in time.
package live

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// Resource is one kind eval reads from a cluster, and how it is listed.
type Resource struct {
	schema.GroupVersionResource
	Kind string
	// LabelSelector and FieldSelector narrow the list to what the decisions read.
	LabelSelector, FieldSelector string
	// Fallback are older versions of the kind, listed in order when the cluster does not
	// serve Version (KubeVirt before 1.7 serves pool.kubevirt.io v1alpha1 alone).
	Fallback []string
}

// Resources are the kinds eval reads, with the verbs (list) the ClusterRole in
// examples/rbac/eval.yaml grants on each.
var Resources = []Resource{
	{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Kind: "Namespace"},
	{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, Kind: "Node"},
	// Pods use their node's resources until they terminate; terminated ones count for nothing.
	{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod",
		FieldSelector: "status.phase!=Succeeded,status.phase!=Failed"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}, Kind: "KubeVirt"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}, Kind: "VirtualMachineInstance"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}, Kind: "VirtualMachineInstanceMigration"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}, Kind: "VirtualMachine"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "migrations.kubevirt.io", Version: "v1alpha1", Resource: "migrationpolicies"}, Kind: "MigrationPolicy"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "pool.virt-rules.io", Version: "v1alpha1", Resource: "virtualmachinepools"}, Kind: "VirtualMachinePool"},
	// KubeVirt's own pools (previewed with KubeVirt's semantics) and the ControllerRevisions
	// its pool controller writes (the pool spec each VM was made from; other controllers'
	// revisions are ignored by eval, they carry no label to select KubeVirt's by).
	{GroupVersionResource: schema.GroupVersionResource{Group: "pool.kubevirt.io", Version: "v1beta1", Resource: "virtualmachinepools"}, Kind: "VirtualMachinePool",
		Fallback: []string{"v1alpha1"}},
	{GroupVersionResource: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "controllerrevisions"}, Kind: "ControllerRevision"},
	// Only the DataVolumes the pool controller keeps for Offline state preservation.
	{GroupVersionResource: schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}, Kind: "DataVolume",
		LabelSelector: "pool.virt-rules.io/preserved"},
}

// Options tune Read.
type Options struct {
	// PageSize is the limit of each list request; 0 is DefaultPageSize.
	PageSize int64
	// MaxBytes bounds the bytes of all pages together; past it Read fails with
	// manifest.ErrTooLarge. 0 is manifest.DefaultMaxBytes.
	MaxBytes int64
	// Warn receives one line per kind the cluster does not serve (its CRD is not installed).
	Warn func(line string)
}

// DefaultPageSize is the default limit of one list request.
const DefaultPageSize = 500

// Config is the client configuration of kubeconfig (a file; "" follows $KUBECONFIG and
// ~/.kube/config, as kubectl does) and context ("" is its current context), with a
// timeout on each request.
func Config(kubeconfig, context string, timeout time.Duration) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.Timeout = timeout
	cfg.UserAgent = "virt-rules-eval"
	return cfg, nil
}

// Source is where every object Read returns was read from: the location of its errors.
const Source = "cluster"

// Read lists every Resource from the cluster of cfg. Each object's position in messages is
// Source ("cluster"): messages name the object beside it. A kind the cluster does not serve is skipped with a warning;
// any other failure (forbidden, unreachable) is an error naming the resource.
func Read(ctx context.Context, cfg *rest.Config, opts Options) ([]manifest.Object, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = manifest.DefaultMaxBytes
	}
	r := &reader{client: dc.RESTClient(), opts: opts, left: opts.MaxBytes}
	var objs []manifest.Object
	for _, res := range Resources {
		got, err := r.list(ctx, res)
		for _, version := range res.Fallback {
			if !apierrors.IsNotFound(err) {
				break
			}
			older := res
			older.Version = version
			got, err = r.list(ctx, older)
		}
		if apierrors.IsNotFound(err) {
			if opts.Warn != nil {
				versions := strings.Join(append([]string{res.GroupVersion().String()}, res.Fallback...), ", ")
				opts.Warn(fmt.Sprintf("the cluster serves no %s (%s): no %s is read", res.Resource, versions, res.Kind))
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		objs = append(objs, got...)
	}
	return objs, nil
}

type reader struct {
	client rest.Interface
	opts   Options
	left   int64
}

// list reads every page of res.
func (r *reader) list(ctx context.Context, res Resource) ([]manifest.Object, error) {
	path := "/apis/" + res.Group + "/" + res.Version + "/" + res.Resource
	if res.Group == "" {
		path = "/api/" + res.Version + "/" + res.Resource
	}
	var objs []manifest.Object
	next := ""
	for {
		req := r.client.Get().AbsPath(path).SetHeader("Accept", "application/json").
			Param("limit", strconv.FormatInt(r.opts.PageSize, 10))
		if next != "" {
			req = req.Param("continue", next)
		}
		if res.LabelSelector != "" {
			req = req.Param("labelSelector", res.LabelSelector)
		}
		if res.FieldSelector != "" {
			req = req.Param("fieldSelector", res.FieldSelector)
		}
		body, err := req.Do(ctx).Raw()
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, err
			}
			return nil, fmt.Errorf("list %s (%s): %w%s%s", res.Resource, res.GroupVersion(), err, serverMessage(body), rbacHint(err))
		}
		r.left -= int64(len(body))
		if r.left < 0 {
			return nil, fmt.Errorf("list %s (%s): %w (%d bytes, all lists together)", res.Resource, res.GroupVersion(), manifest.ErrTooLarge, r.opts.MaxBytes)
		}
		var list unstructured.UnstructuredList
		if err := list.UnmarshalJSON(body); err != nil {
			return nil, fmt.Errorf("list %s (%s): decode: %w", res.Resource, res.GroupVersion(), err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			u.SetGroupVersionKind(res.GroupVersion().WithKind(res.Kind))
			u.SetManagedFields(nil)
			objs = append(objs, manifest.Object{Source: Source, Unstructured: u})
		}
		if next = list.GetContinue(); next == "" {
			return objs, nil
		}
	}
}

// serverMessage is the message of the Status the API server answered with, when client-go's
// error does not carry it (": " and the message, or "").
func serverMessage(body []byte) string {
	var status metav1.Status
	if json.Unmarshal(body, &status) != nil || status.Message == "" {
		return ""
	}
	return ": " + status.Message
}

func rbacHint(err error) string {
	if apierrors.IsForbidden(err) {
		return " (eval needs list on every kind it reads: examples/rbac/eval.yaml)"
	}
	return ""
}
