package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

func newEvalCommand() *cobra.Command {
	var (
		b       bundleFlags
		dlog    decisionLogFlag
		output  string
		explain bool
		now     string
		in      inputFlags
		cands   bool
		drift   bool
		// drainNodes and drainSelector name the nodes of --drain.
		drainNodes    []string
		drainSelector string
		// baseline and baselineGroupBy ask for cpuBaseline.
		baseline        bool
		baselineGroupBy string
	)
	cmd := &cobra.Command{
		Use:   "eval [flags] PATH... | --kubeconfig FILE",
		Short: "Print what the controllers would decide for the objects in manifests",
		Long: `eval reads Kubernetes manifests (YAML or JSON files, directories, or - for stdin; several
documents per file and List kinds are fine) and prints what the virt-rules controllers would
decide for them, without a cluster:

  migrationPolicies  the MigrationPolicy each VirtualMachineInstance obeys and its effective
                     migration configuration (reads VirtualMachineInstance, Namespace,
                     MigrationPolicy and KubeVirt objects)
  pools              the plan of each VirtualMachinePool (pool.virt-rules.io): the VMs to
                     create, delete, update, restart and re-provision (reads
                     VirtualMachinePool, VirtualMachine, VirtualMachineInstance and kept
                     DataVolume objects; --now fixes the time, for reproducible plans)

Objects of other kinds are ignored with one line per kind on stderr. Objects KubeVirt is
done with are reported, not decided: a migration in a final phase (Succeeded, Failed) with its
phase and no target decision, whether or not its VMI is still there; a VMI in a final phase with its
phase and its MigrationPolicy (the controller keeps annotating it) but no migration or
scheduling decision.

An object that cannot be decided (malformed, invalid by the rules' validation, inconsistent
such as a pending migration of an absent VMI) is one entry of the report's errors, named and
located (FILE:LINE of the field at fault, or "cluster"), and one line on stderr; every other
object is decided all the same.

Exit status: 0 nothing wrong; 1 some objects in error (the report is complete for the rest);
2 the run could not happen (bad flags, a bundle refused, no input, over --max-input-bytes, a
cluster that cannot be read).

--kubeconfig reads the same kinds from a running cluster instead (paged lists; the read-only
ClusterRole it needs is examples/rbac/eval.yaml) and adds drift: every value stored in the
cluster that differs from the decision (a VMI's migrations.virt-rules.io/policy and
configuration annotations and status.migrationState, a node's
kubevirt/host-model-migratability-level label, a pool's VMs). --drift adds it for manifests
(kubectl get -o yaml output).

--candidates adds migrationCandidates: for every VMI on a node that no migration moves, the
nodes a migration adding no constraint could take it to now, and every other node's first
reason it cannot.

--drain NODE[,NODE...] and --drain-selector SELECTOR add drain: what draining those nodes
(kubectl drain: cordon, then evict) does to every VMI on them, by its eviction strategy as
KubeVirt resolves it: migrate (to targetNode, the evacuees placed one after another, each
taking its target's capacity), shutdown, external, or stuck with a reason (NotLiveMigratable,
NoCapacity, NoMatchingNode, ...). The exit status is 1 when any VMI is stuck.

--cpu-baseline adds cpuBaseline: for the schedulable nodes (or each group of them by the value
of the node label --cpu-baseline-group-by names), the guest CPU every node runs, read from
KubeVirt's node labeller's labels and libvirt's cpu_map: a CPU model and features to pin
(spec.configuration.cpuModel of the KubeVirt CR, spec.domain.cpu of a VM), or none with a
reason (VendorsDiffer, NoCommonModel, NoNodes), and the better CPU the group would have
without each kind of node (tradeoffs). Nodes left out are listed with why.`,
		Example: `  virt-rules eval examples/migration-policy/
  kubectl get vmi,ns,migrationpolicies,kubevirt -A -o yaml | virt-rules eval -o table -
  virt-rules eval --explain -o yaml --bundle ./my-bundle examples/migration-policy/
  virt-rules eval --bundle signed.tar.gz --bundle-verification-key key.pub.pem examples/migration-policy/
  virt-rules eval -o table --kubeconfig ~/.kube/config --context prod
  virt-rules eval --candidates examples/migration-target/
  virt-rules eval -o table --drain node-1,node-2 examples/drain/
  virt-rules eval -o table --cpu-baseline examples/cpu-baseline/`,
		Args: withStatus(2, in.args),
		RunE: withStatus(2, func(cmd *cobra.Command, paths []string) error {
			format, ok := formats[output]
			if !ok {
				return fmt.Errorf("-o %s: want json, yaml or table", output)
			}
			logger, dlogOpts, err := dlog.open(slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)))
			if err != nil {
				return err
			}
			defer closeDecisionLog(logger, slog.Default())
			eng, err := b.engine(cmd.Context(), cmd.ErrOrStderr(), dlogOpts...)
			if err != nil {
				return err
			}
			warn := warner(cmd.ErrOrStderr())
			objs, unreadable, at, err := in.readAt(cmd, paths, warn, now)
			if err != nil {
				return err
			}
			opts := eval.Options{Explain: explain, Warn: warn, Now: at, Candidates: cands, Drift: drift || in.isLive(),
				Drain: drainNodes, DrainSelector: drainSelector, CPUBaseline: baseline, CPUBaselineGroupBy: baselineGroupBy}
			report, err := eval.Run(cmd.Context(), eng, objs, opts)
			if err != nil {
				return err
			}
			report.AddErrors(unreadable...)
			if err := format(cmd.OutOrStdout(), report); err != nil {
				return err
			}
			inError := objectErrors(cmd.ErrOrStderr(), report.Errors)
			if d := report.Drain; d != nil && d.Stuck > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "drain: %d %s stuck: draining %s cannot finish\n", d.Stuck, plural(d.Stuck, "VMI", "VMIs"), strings.Join(d.Nodes, ", "))
				return exitStatus(1)
			}
			return inError
		}),
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &statusError{status: 2, err: err} })
	b.register(cmd)
	dlog.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "json", "output format: json, yaml or table")
	cmd.Flags().BoolVar(&explain, "explain", false, "show every candidate of each decision and why it won or lost")
	cmd.Flags().StringVar(&now, "now", "", "the `TIME` (RFC 3339) plans are made for (default: now)")
	cmd.Flags().BoolVar(&cands, "candidates", false, "add, for every VMI on a node that no migration moves, the nodes it could migrate to now and each other node's first reason it cannot")
	cmd.Flags().StringSliceVar(&drainNodes, "drain", nil, "add drain: what draining these `NODE[,NODE...]` does to every VMI on them (exit 1 when any is stuck)")
	cmd.Flags().StringVar(&drainSelector, "drain-selector", "", "add drain for the nodes this label `SELECTOR` matches (with --drain: both)")
	cmd.Flags().BoolVar(&baseline, "cpu-baseline", false, "add cpuBaseline: the guest CPU model and features every schedulable node runs, and what each kind of node costs it")
	cmd.Flags().StringVar(&baselineGroupBy, "cpu-baseline-group-by", "", "add cpuBaseline per group of nodes sharing a value of this node `LABEL` (e.g. topology.kubernetes.io/zone)")
	cmd.Flags().BoolVar(&drift, "drift", false, "add every stored value that differs from its decision (always on with --kubeconfig)")
	in.register(cmd, true)
	return cmd
}

// parseNow reads --now; "" is the current time.
func parseNow(value string) (time.Time, error) {
	if value == "" {
		return time.Now(), nil
	}
	t, err := time.Parse(time.RFC3339, value)
	if err != nil {
		return time.Time{}, fmt.Errorf("--now %s: want an RFC 3339 time such as 2026-01-02T15:04:05Z", value)
	}
	return t, nil
}

var formats = map[string]func(io.Writer, *eval.Report) error{
	"json":  writeJSON,
	"yaml":  writeYAML,
	"table": writeTable,
}

func writeJSON(w io.Writer, r *eval.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func writeYAML(w io.Writer, r *eval.Report) error {
	out, err := yaml.Marshal(r)
	if err != nil {
		return fmt.Errorf("format yaml: %w", err)
	}
	_, err = w.Write(out)
	return err
}

// writeTable prints one row per VMI: the policy it obeys and its score (matching labels),
// with the candidates under it when explained.
func writeTable(w io.Writer, r *eval.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VMI\tMIGRATION POLICY\tSCORE\tBANDWIDTH\tPOST-COPY")
	for _, d := range r.MigrationPolicies {
		policy := "<none>"
		if d.Policy != nil {
			policy = *d.Policy
		}
		bandwidth := "-"
		if q := d.Configuration.BandwidthPerMigration; q != nil {
			bandwidth = q.String()
		}
		postCopy := "-"
		if p := d.Configuration.AllowPostCopy; p != nil {
			postCopy = fmt.Sprint(*p)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", d.VMI, policy, d.MatchingLabels, bandwidth, postCopy)
		if d.Explanation == nil {
			continue
		}
		for i, c := range d.Explanation.Candidates {
			// The reason is a trailing cell, so it does not widen the columns above.
			fmt.Fprintf(tw, "  %d. %s\t%d/%d\t\t\t%s\n", i+1, c.Policy, c.MatchingLabels, c.RequiredLabels, c.Reason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeTargetsTable(w, r.MigrationTargets); err != nil {
		return err
	}
	if err := writePoolTable(w, r.Pools); err != nil {
		return err
	}
	if err := writeDrainTable(w, r.Drain); err != nil {
		return err
	}
	if err := writeBaselineTable(w, r.CPUBaseline); err != nil {
		return err
	}
	if err := writeCandidatesTable(w, r.MigrationCandidates); err != nil {
		return err
	}
	if err := writeDriftTable(w, r.Drift); err != nil {
		return err
	}
	return writeErrorsTable(w, r.Errors)
}

// writeTargetsTable prints one row per migration: its VMI, phase, candidate nodes and, when
// none, the reason; a finished migration's row has its phase alone.
func writeTargetsTable(w io.Writer, targets []eval.MigrationTargetResult) error {
	if len(targets) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nMIGRATION\tVMI\tPHASE\tCANDIDATE NODES\tREASON")
	for _, t := range targets {
		phase := t.Phase
		if phase == "" {
			phase = "-"
		}
		cands := "-"
		if len(t.CandidateNodes) > 0 {
			cands = strings.Join(t.CandidateNodes, ",")
		}
		reason := ""
		if t.Error != nil {
			reason = t.Error.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Migration, t.VMI, phase, cands, reason)
	}
	return tw.Flush()
}

// writeErrorsTable prints one row per error: where, which object, which field, what.
func writeErrorsTable(w io.Writer, errs []*manifest.Error) error {
	if len(errs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nERRORS\nLOCATION\tOBJECT\tFIELD\tMESSAGE")
	for _, e := range errs {
		object, field := e.Object(), e.Field
		if object == "" {
			object = "-"
		}
		if field == "" {
			field = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Location, object, field, e.Message)
	}
	return tw.Flush()
}

// writeDrainTable prints one row per VMI on the drained nodes: what its eviction does, where
// it goes, or why it is stuck.
func writeDrainTable(w io.Writer, d *eval.DrainResult) error {
	if d == nil {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nDRAIN %s: %d %s, %d stuck\n", strings.Join(d.Nodes, ", "), len(d.VMIs), plural(len(d.VMIs), "VMI", "VMIs"), d.Stuck)
	fmt.Fprintln(tw, "VMI\tNODE\tEVICTION\tACTION\tTARGET\tCANDIDATES\tREASON")
	for _, v := range d.VMIs {
		target, reason := cmp.Or(v.TargetNode, "-"), cmp.Or(v.Reason, "-")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", v.VMI, v.Node, v.EvictionStrategy, v.Action, target, len(v.CandidateNodes), reason)
	}
	return tw.Flush()
}

// writeBaselineTable prints one row per group of cpuBaseline, then for each group the
// features to require or disable, why there is no CPU, the tradeoffs, the nodes left out and
// what to paste.
func writeBaselineTable(w io.Writer, groups []eval.CPUBaselineResult) error {
	if groups == nil {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nCPU BASELINE\tNODES\tVENDOR\tMODEL\tFEATURES\tSHARE\tHOST-MODEL LEVELS\tREASON")
	for _, g := range groups {
		levels := "-"
		if l := g.HostModelLevels; l != nil {
			levels = fmt.Sprintf("%d-%d%%", l.Min, l.Max)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d%%\t%s\t%s\n", groupTitle(g.Group), len(g.Nodes), orNone(g.Vendor), orNone(g.Model),
			len(g.Features), g.Share, levels, cmp.Or(g.Reason, "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", groupTitle(g.Group))
		for _, policy := range []string{"require", "disable"} {
			var names []string
			for _, f := range g.Features {
				if f.Policy == policy {
					names = append(names, f.Name)
				}
			}
			if len(names) > 0 {
				fmt.Fprintf(w, "  %s: %s\n", policy, strings.Join(names, ", "))
			}
		}
		if g.Message != "" {
			fmt.Fprintf(w, "  %s\n", g.Message)
		}
		for _, t := range g.Tradeoffs {
			fmt.Fprintf(w, "  without %s (%s): %s, %d more features: %s\n", eval.FirstNames(t.Nodes, 5), cmp.Or(t.HostModel, "no host model"),
				orNone(t.Model), len(t.GainedFeatures), eval.FirstNames(t.GainedFeatures, 12))
		}
		for _, n := range g.NotConsidered {
			fmt.Fprintf(w, "  not considered: %s (%s)\n", n.Node, n.Reason)
		}
		if g.Model == nil {
			continue
		}
		for _, s := range []struct{ key, what string }{
			{"kubevirt", "the KubeVirt CR, for every VM without a CPU model of its own"},
			{"cpu", "a VM's spec.domain.cpu, with the features (the KubeVirt CR has no cluster-wide list)"},
		} {
			data, err := yaml.Marshal(g.Snippets[s.key])
			if err != nil {
				return fmt.Errorf("cpuBaseline %s: %w", g.Group, err)
			}
			fmt.Fprintf(w, "  # %s\n%s", s.what, indentLines(string(data), "  "))
		}
	}
	return nil
}

// groupTitle is how the table names a baseline group.
func groupTitle(group string) string { return cmp.Or(group, "(all nodes)") }

// indentLines puts prefix before every line of s.
func indentLines(s, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(prefix + line)
	}
	return b.String()
}

// orNone is *s, or <none> for nil.
func orNone(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

// writeCandidatesTable prints one row per VMI not migrating: its node and candidates, then
// each other node with its first reason.
func writeCandidatesTable(w io.Writer, cands []eval.MigrationCandidatesResult) error {
	if len(cands) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nVMI\tNODE\tCANDIDATE NODES\tREASON")
	for _, c := range cands {
		reason := ""
		if c.Error != nil {
			reason = c.Error.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.VMI, c.Node, strings.Join(c.CandidateNodes, ","), reason)
		for _, n := range c.Nodes {
			if !n.Candidate {
				fmt.Fprintf(tw, "  %s\t\t\t%s\n", n.Node, n.Reason)
			}
		}
	}
	return tw.Flush()
}

// writeDriftTable prints one row per stored value that differs from its decision.
func writeDriftTable(w io.Writer, drift []eval.DriftResult) error {
	if len(drift) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nDRIFT\tOBJECT\tFIELD\tSTORED\tDECIDED")
	for _, d := range drift {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Kind, d.Object, d.Field, compact(d.Stored), compact(d.Decided))
	}
	return tw.Flush()
}

// compact is v as one line of JSON, cut to 80 characters; <none> for nil.
func compact(v any) string {
	if v == nil {
		return "<none>"
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if s, ok := v.(string); ok {
		return s
	}
	if len(data) > 80 {
		return string(data[:77]) + "..."
	}
	return string(data)
}

// writePoolTable prints one row per pool: how many VMs each action of its plan takes, and
// whose plan it is: virt-rules' pool controller's, or, for KubeVirt's own pool.kubevirt.io
// pools, a preview of what KubeVirt's pool controller does next.
func writePoolTable(w io.Writer, pools []eval.PoolResult) error {
	if len(pools) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nPOOL\tCREATE\tDELETE\tUPDATE\tRESTART\tREPROVISION\tPLANNED BY")
	for _, p := range pools {
		by := "virt-rules"
		if p.Preview {
			by = "KubeVirt (preview)"
			if p.Message != "" {
				by += ": " + p.Message
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Pool, len(p.Create), len(p.Delete), len(p.Update), len(p.Restart), len(p.Reprovision), by)
	}
	return tw.Flush()
}
