// Package nodelabeller keeps the host-model migratability level of every schedulable node
// as the label kubevirt/host-model-migratability-level (design 002).
//
// Every level depends on every node, so all node events map to one work item; the engine's
// node view is updated only for nodes whose resourceVersion changed (adding or removing a
// node costs one count and one small evaluation), and only nodes whose level changed are
// patched. Only the leader runs it.
package nodelabeller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

const (
	// ControllerName names the controller in logs and metrics.
	ControllerName = "nodelabeller"
	// FieldManager owns the label this controller writes.
	FieldManager = "virt-rules-nodelabeller"
	// LabelLevel is the label holding a node's level, 0-100 (design 002).
	LabelLevel = "kubevirt/host-model-migratability-level"
)

// clusterKey is the one work item every node event maps to.
var clusterKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "nodes"}}

// Reconciler labels nodes with their migratability level.
type Reconciler struct {
	Client client.Client
	Nodes  *engine.Nodes
	// PatchWorkers is how many nodes are patched at once (at least 1).
	PatchWorkers int
	// Shadow, when set, is asked the levels again with the candidate bundle and its own view
	// of the nodes (CandidateNodes), never acted on.
	Shadow         *shadow.Shadow
	CandidateNodes *engine.Nodes

	mu          sync.Mutex
	candidateMu sync.Mutex // serialises the candidate's view of the nodes
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// levelInputsChanged passes a node's creation and deletion, and an update only when what a
// level reads changed: its labels or spec.unschedulable (engine.NewLevelNodes keeps nothing
// else). A node's status changes (conditions, heartbeats, images) far more often than those,
// and each reconcile lists every node.
var levelInputsChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*corev1.Node)
		cur, curOK := e.ObjectNew.(*corev1.Node)
		if !oldOK || !curOK {
			return true
		}
		return old.Spec.Unschedulable != cur.Spec.Unschedulable || !maps.Equal(old.Labels, cur.Labels)
	},
}

// SetupWithManager maps every node event that can change a level to the one work item.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{clusterKey}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		Watches(&corev1.Node{}, all, builder.WithPredicates(levelInputsChanged))
	if r.Shadow != nil {
		// A new candidate revision: every level is compared again.
		b = b.WatchesRawSource(source.Channel(r.Shadow.Resyncs(), all))
	}
	return b.Complete(r)
}

// Reconcile brings the node view up to date, asks for the levels and patches the nodes
// whose label differs.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var nodes corev1.NodeList
	// Read only: Sync converts what it keeps, and patches send only the label.
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, fmt.Errorf("list nodes: %w", err)
	}
	if err := r.Nodes.Sync(nodes.Items); err != nil {
		return reconcile.Result{}, err
	}
	levels, err := r.Nodes.Migratability(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if r.Shadow != nil {
		r.compareCandidate(ctx, nodes.DeepCopy().Items, levels)
	}
	// One node joining or leaving may move the level of most others: patch in parallel.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, r.PatchWorkers))
	patched := 0
	for i := range nodes.Items {
		node := &nodes.Items[i]
		want, has := "", false
		if level, ok := levels[node.Name]; ok {
			want, has = strconv.Itoa(level), true
		}
		current, present := node.Labels[LabelLevel]
		if present == has && current == want {
			continue
		}
		patched++
		g.Go(func() error { return r.patchLevel(gctx, node, want, has) })
	}
	if err := g.Wait(); err != nil {
		return reconcile.Result{}, err
	}
	if patched > 0 {
		log.FromContext(ctx).Info("migratability levels written", "nodes", len(nodes.Items), "patched", patched)
	}
	return reconcile.Result{}, nil
}

func (r *Reconciler) patchLevel(ctx context.Context, node *corev1.Node, level string, has bool) error {
	var value any // null removes the label
	if has {
		value = level
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{LabelLevel: value}}})
	if err != nil {
		return err
	}
	err = r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager))
	if err = client.IgnoreNotFound(err); err != nil { // a node deleted meanwhile needs no label
		return fmt.Errorf("label node %s: %w", node.Name, err)
	}
	return nil
}

// compareCandidate asks the candidate bundle for every node's level, in the background, and
// compares node by node.
func (r *Reconciler) compareCandidate(ctx context.Context, nodes []corev1.Node, levels map[string]int) {
	objects := make([]shadow.Object, len(nodes))
	for i := range nodes {
		objects[i] = shadow.Object{Name: nodes[i].Name}
	}
	active := &eval.Report{NodeMigratability: levelResults(levels)}
	r.Shadow.Compare(ctx, shadow.DecisionNodeMigratability, objects, active, func(ctx context.Context) (*eval.Report, error) {
		r.candidateMu.Lock()
		defer r.candidateMu.Unlock()
		if err := r.CandidateNodes.Sync(nodes); err != nil {
			return nil, err
		}
		levels, err := r.CandidateNodes.Migratability(ctx)
		if err != nil {
			return nil, err
		}
		return &eval.Report{NodeMigratability: levelResults(levels)}, nil
	})
}

func levelResults(levels map[string]int) []eval.NodeMigratabilityResult {
	out := make([]eval.NodeMigratabilityResult, 0, len(levels))
	for node, level := range levels {
		out = append(out, eval.NodeMigratabilityResult{Node: node, Level: level})
	}
	return out
}
