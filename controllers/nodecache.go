package controllers

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/virt-rules/virt-rules/internal/intern"
)

// nodeStrings interns the label and annotation keys and values of cached nodes: 5,000 nodes
// repeat the same node-labeller keys, nearly all with the value "true".
var nodeStrings = intern.New(1 << 16)

// TrimNode is the manager's cache transform for Nodes. It keeps what a reader of a cached Node
// reads, with its label and annotation strings interned, and drops the rest:
//
//   - metadata (but managedFields) and spec, whole: names, labels (every node decision),
//     spec.taints and spec.unschedulable (migration targets, levels);
//   - status.allocatable: what a migration target must fit in;
//   - status.conditions: no embedded rule reads them, but a bundle's rules may (a node not
//     Ready), and `virt-rules eval` gives the same (internal/eval keeps the same fields).
//
// Dropped: managedFields, and the rest of status (capacity, addresses, daemonEndpoints,
// nodeInfo, images, volumes, config, phase, runtimeHandlers, features). No controller, webhook,
// Rego rule or reference implementation reads them (TestTrimNodeKeeps lists what they do
// read); nodeInfo and images are most of a real node's status.
func TrimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	node.ManagedFields = nil
	node.Labels = nodeStrings.Strings(node.Labels)
	node.Annotations = nodeStrings.Strings(node.Annotations)
	conditions := node.Status.Conditions
	for i := range conditions {
		c := &conditions[i] // the same few types, statuses, reasons and messages on every node
		c.Type = corev1.NodeConditionType(nodeStrings.String(string(c.Type)))
		c.Status = corev1.ConditionStatus(nodeStrings.String(string(c.Status)))
		c.Reason, c.Message = nodeStrings.String(c.Reason), nodeStrings.String(c.Message)
	}
	node.Status = corev1.NodeStatus{Allocatable: node.Status.Allocatable, Conditions: conditions}
	return node, nil
}
