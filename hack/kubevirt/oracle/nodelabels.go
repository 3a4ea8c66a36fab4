//go:build virtrules_oracle

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	nodelabeller "kubevirt.io/kubevirt/pkg/virt-handler/node-labeller"
)

// nodeLabelsLine is node-labels' answer for one folder of node-labeller files.
type nodeLabelsLine struct {
	Source string `json:"source"`
	// Labels are the labels virt-handler's node labeller gives the Node; null when Error is
	// set.
	Labels map[string]string `json:"labels"`
	Error  string            `json:"error,omitempty"`
}

func nodeLabelsCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("node-labels", flag.ContinueOnError)
	kvFile := fs.String("kubevirt", "", "YAML of the KubeVirt CR whose configuration the cluster has (default: an empty spec, status.defaultArchitecture amd64)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("node-labels: %w", err)
	}
	dirs := fs.Args()
	if len(dirs) == 0 {
		return errors.New("node-labels: no folder of virsh_domcapabilities.xml and supported_features.xml")
	}
	for _, d := range dirs {
		if strings.HasPrefix(d, "-") {
			return fmt.Errorf("node-labels: flag %s after the folders", d)
		}
	}
	// The node labeller runs in virt-handler, on the test cluster's amd64 nodes.
	c, err := newCluster(*kvFile, defaultArch)
	if err != nil {
		return fmt.Errorf("node-labels: %w", err)
	}
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for _, dir := range dirs {
		line := nodeLabelsLine{Source: dir}
		err := safely("virt-handler's node labeller", func() error {
			labels, err := nodelabeller.VirtRulesLabels(c.config, dir)
			line.Labels = labels
			return err
		})
		// KubeVirt's log lines (the read error again, the realtime probe's): not part of
		// the answer.
		c.logs.drain()
		if err != nil {
			line.Labels = nil
			line.Error = err.Error()
		}
		if err := enc.Encode(line); err != nil {
			return fmt.Errorf("node-labels: write: %w", err)
		}
	}
	return nil
}
