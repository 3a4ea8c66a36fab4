package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The iptables chains every kubelet on a machine makes and shares (its canaries, which tell it
// that something flushed its rules, and the firewall rule that keeps other hosts from
// 127.0.0.1), removed when a real node stops; a kubelet still running makes them again.
var kubeletChains = map[string][]string{
	"filter": {"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"},
	"nat":    {"KUBE-KUBELET-CANARY"},
	"mangle": {"KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"},
}

// setUpNetwork makes the node's CNI bridge before the CNI plugin would, so that a pod reaches
// the API server as in a cluster: at Service default/kubernetes's ClusterIP (in-cluster
// configuration), which kube-proxy would route. Without kube-proxy, one DNAT rule for the
// pods of this bridge sends that address to the node's API proxy on 127.0.0.1, which
// route_localnet on the bridge (and on it only) allows; kubelet's own KUBE-FIREWALL rule lets
// DNAT'd connections to 127.0.0.1 through.
func (n *RealNode) setUpNetwork(ctx context.Context) error {
	svc := &corev1.Service{}
	if err := n.cluster.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, svc); err != nil {
		return fmt.Errorf("read Service default/kubernetes: %w", err)
	}
	if len(svc.Spec.Ports) == 0 || net.ParseIP(svc.Spec.ClusterIP) == nil {
		return fmt.Errorf("read Service default/kubernetes: no ClusterIP and port: %+v", svc.Spec)
	}
	rule := []string{"PREROUTING", "-i", n.bridge, "-d", svc.Spec.ClusterIP + "/32", "-p", "tcp",
		"--dport", strconv.Itoa(int(svc.Spec.Ports[0].Port)), "-m", "comment", "--comment", "virt-rules real node " + n.Name,
		"-j", "DNAT", "--to-destination", n.proxy.addr}
	if _, err := net.InterfaceByName(n.bridge); err == nil {
		// Left by a run that was killed: the name is this node's alone (bridgeName).
		if _, err := output(ctx, "ip", "link", "delete", n.bridge); err != nil {
			return err
		}
	}
	if _, err := output(ctx, "ip", "link", "add", "name", n.bridge, "type", "bridge"); err != nil {
		return err
	}
	if _, err := output(ctx, "ip", "link", "set", n.bridge, "up"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", n.bridge, "route_localnet"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("let %s route to 127.0.0.1: %w", n.bridge, err)
	}
	if _, err := output(ctx, "iptables", append([]string{"-t", "nat", "-A"}, rule...)...); err != nil {
		return err
	}
	n.dnat = rule
	return nil
}

// tearDownNetwork removes the DNAT rule, the bridge (and its route_localnet with it) and
// kubelet's chains.
func (n *RealNode) tearDownNetwork(ctx context.Context) error {
	var errs []error
	if n.dnat != nil {
		if _, err := output(ctx, "iptables", append([]string{"-t", "nat", "-D"}, n.dnat...)...); err != nil {
			errs = append(errs, err)
		}
		n.dnat = nil
	}
	if _, err := net.InterfaceByName(n.bridge); err == nil {
		if _, err := output(ctx, "ip", "link", "delete", n.bridge); err != nil {
			errs = append(errs, err)
		}
	}
	// Jumps first, then the emptied chains; a chain another kubelet already removed is no
	// failure.
	for _, hook := range []string{"INPUT", "OUTPUT"} {
		_, _ = output(ctx, "iptables", "-t", "filter", "-D", hook, "-j", "KUBE-FIREWALL")
	}
	for table, chains := range kubeletChains {
		for _, chain := range chains {
			if _, err := output(ctx, "iptables", "-t", table, "-F", chain); err == nil {
				_, _ = output(ctx, "iptables", "-t", table, "-X", chain)
			}
		}
	}
	return errors.Join(errs...)
}
