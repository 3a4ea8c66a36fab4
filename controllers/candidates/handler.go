// Package candidates serves, for a VMI not migrating, the nodes it could migrate to now and
// every other node's first reason it cannot: engine.MigrationCandidates on the cluster's
// current state, as `virt-rules eval --candidates` decides it on manifests, at a
// subresource-like path of the controller's metrics server:
//
//	GET /apis/virt-rules.io/v1alpha1/namespaces/NS/virtualmachineinstances/NAME/candidates
//
// The body is eval's migrationCandidates entry for the VMI. A VMI that does not exist is a
// 404 naming it; one not running on a node, or migrating (its migrationState not completed,
// or a VirtualMachineInstanceMigration of it not Succeeded or Failed), a 409.
package candidates

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/delegatedauth"
	"github.com/virt-rules/virt-rules/internal/eval"
)

// Pattern is the handler's path, as an http.ServeMux pattern.
const Pattern = "/apis/virt-rules.io/v1alpha1/namespaces/{namespace}/virtualmachineinstances/{name}/candidates"

// Handler answers the candidates of one VMI.
type Handler struct {
	// Client reads VMIs, migrations, nodes and the KubeVirt CR (the informer cache).
	Client client.Reader
	// PodReader lists the launcher pod and the pods on candidate nodes (the API server).
	PodReader client.Reader
	// VMIReader reads the whole VMI: the API server, since the manager's cache keeps VMIs as
	// metadata only (controllers.ManagerOptions). Nil: Client.
	VMIReader client.Reader
	Engine    *engine.Engine
	// Nodes is the engine's view of the nodes, owned by this handler.
	Nodes *engine.Nodes

	mu sync.Mutex // serialises Nodes.Sync
}

// Attributes are what a caller must be allowed for the request to reach the handler: get
// the VMI (get virtualmachineinstances in its namespace), for internal/delegatedauth; false
// for any other path.
func Attributes(r *http.Request) (authorizer.AttributesRecord, bool) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if ns == "" || name == "" {
		return authorizer.AttributesRecord{}, false
	}
	return authorizer.AttributesRecord{
		Verb: "get", APIGroup: "kubevirt.io", APIVersion: "v1", Resource: "virtualmachineinstances",
		Namespace: ns, Name: name, ResourceRequest: true,
	}, true
}

// ServeHTTP decides the candidates of the VMI the path names.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		delegatedauth.WriteStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, r.Method+" is not allowed: GET the candidates")
		return
	}
	key := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	result, err := h.decide(r.Context(), key)
	var se *apierrors.StatusError
	switch {
	case errors.As(err, &se):
		delegatedauth.WriteStatus(w, int(se.ErrStatus.Code), se.ErrStatus.Reason, se.ErrStatus.Message)
		return
	case err != nil:
		delegatedauth.WriteStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(result) // the client went away
}

// decide reads the VMI and the cluster and asks the engine; errors the caller should see as
// they are (404, 409) are *apierrors.StatusError.
func (h *Handler) decide(ctx context.Context, key types.NamespacedName) (*eval.MigrationCandidatesResult, error) {
	vmi := kinds.NewObject(kinds.VirtualMachineInstance)
	if err := cmp.Or[client.Reader](h.VMIReader, h.Client).Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, apierrors.NewNotFound(groupResource(), key.String())
		}
		return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
	}
	node, _, _ := unstructured.NestedString(vmi.Object, "status", "nodeName")
	if node == "" {
		return nil, apierrors.NewConflict(groupResource(), key.String(), errors.New("it runs on no node (status.nodeName): nothing to migrate"))
	}
	moving, err := h.migrating(ctx, vmi)
	if err != nil {
		return nil, err
	}
	if moving != "" {
		return nil, apierrors.NewConflict(groupResource(), key.String(), fmt.Errorf("it is migrating (%s): ask again when the migration ends", moving))
	}
	in, err := h.input(ctx, vmi)
	if err != nil {
		return nil, err
	}
	c, err := h.Engine.MigrationCandidates(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("decide the candidates of VirtualMachineInstance %s: %w", key, err)
	}
	// Pods count against a node's allocatable: read those of the nodes that could take the
	// VMI, then decide again, as the migrationtarget controller does.
	if len(c.CandidateNodes) > 0 {
		for _, n := range c.CandidateNodes {
			pods, err := h.podsOn(ctx, n)
			if err != nil {
				return nil, err
			}
			in.Pods = append(in.Pods, pods...)
		}
		if c, err = h.Engine.MigrationCandidates(ctx, in); err != nil {
			return nil, fmt.Errorf("decide the candidates of VirtualMachineInstance %s: %w", key, err)
		}
	}
	return &eval.MigrationCandidatesResult{VMI: key.String(), Node: node, CandidateNodes: c.CandidateNodes, Nodes: c.Nodes, Error: c.Error}, nil
}

func groupResource() schema.GroupResource {
	return schema.GroupResource{Group: "kubevirt.io", Resource: "virtualmachineinstances"}
}

// migrating says why vmi is migrating ("" when it is not): its migrationState, or a
// migration of it not yet Succeeded or Failed.
func (h *Handler) migrating(ctx context.Context, vmi *unstructured.Unstructured) (string, error) {
	if state, found, _ := unstructured.NestedMap(vmi.Object, "status", "migrationState"); found && state != nil {
		completed, _ := state["completed"].(bool)
		failed, _ := state["failed"].(bool)
		if !completed && !failed {
			return "status.migrationState is neither completed nor failed", nil
		}
	}
	migrations := kinds.NewList(kinds.VirtualMachineInstanceMigration)
	if err := h.Client.List(ctx, migrations, client.InNamespace(vmi.GetNamespace())); err != nil {
		return "", fmt.Errorf("list migrations in %s: %w", vmi.GetNamespace(), err)
	}
	for _, m := range migrations.Items {
		target, _, _ := unstructured.NestedString(m.Object, "spec", "vmiName")
		phase, _, _ := unstructured.NestedString(m.Object, "status", "phase")
		if target == vmi.GetName() && phase != "Succeeded" && phase != "Failed" {
			return fmt.Sprintf("VirtualMachineInstanceMigration %s/%s, phase %q", m.GetNamespace(), m.GetName(), phase), nil
		}
	}
	return "", nil
}

// input is what MigrationCandidates reads, without the pods on nodes.
func (h *Handler) input(ctx context.Context, vmi *unstructured.Unstructured) (engine.MigrationCandidatesInput, error) {
	in := engine.MigrationCandidatesInput{VMI: vmi, Nodes: h.Nodes}
	var nodes corev1.NodeList
	if err := h.Client.List(ctx, &nodes); err != nil {
		return in, fmt.Errorf("list nodes: %w", err)
	}
	h.mu.Lock()
	err := h.Nodes.Sync(nodes.Items)
	h.mu.Unlock()
	if err != nil {
		return in, err
	}
	var launchers corev1.PodList
	if err := h.PodReader.List(ctx, &launchers, client.InNamespace(vmi.GetNamespace()),
		client.MatchingLabels{"kubevirt.io/created-by": string(vmi.GetUID())}); err != nil {
		return in, fmt.Errorf("list launcher pods of VMI %s/%s: %w", vmi.GetNamespace(), vmi.GetName(), err)
	}
	pods, err := launcher.UnstructuredPods(launchers.Items)
	if err != nil {
		return in, err
	}
	in.SourcePod = engine.SourceLauncherPod(vmi, pods)
	if in.KubeVirt, err = kinds.ReadClusterKubeVirt(ctx, h.Client); err != nil {
		return in, err
	}
	return in, nil
}

func (h *Handler) podsOn(ctx context.Context, node string) ([]*unstructured.Unstructured, error) {
	var list corev1.PodList
	if err := h.PodReader.List(ctx, &list, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
		return nil, fmt.Errorf("list pods on node %s: %w", node, err)
	}
	return launcher.UnstructuredPods(list.Items)
}
