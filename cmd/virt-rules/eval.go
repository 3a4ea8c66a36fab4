package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

func newEvalCommand() *cobra.Command {
	var (
		b        bundleFlags
		dlog     decisionLogFlag
		output   string
		explain  bool
		now      string
		maxInput int64
	)
	cmd := &cobra.Command{
		Use:   "eval [flags] PATH...",
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

Objects of other kinds are ignored with one line each on stderr. Malformed input exits
non-zero with file:document: field: what is wrong.`,
		Example: `  virt-rules eval examples/migration-policy/
  kubectl get vmi,ns,migrationpolicies,kubevirt -A -o yaml | virt-rules eval -o table -
  virt-rules eval --explain -o yaml --bundle ./my-bundle examples/migration-policy/
  virt-rules eval --bundle signed.tar.gz --bundle-verification-key key.pub.pem examples/migration-policy/`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, paths []string) error {
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
			objs, err := manifest.ReadLimited(paths, cmd.InOrStdin(), maxInput)
			if err != nil {
				return err
			}
			at, err := parseNow(now)
			if err != nil {
				return err
			}
			warn := func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), "warning:", line) }
			report, err := eval.Run(cmd.Context(), eng, objs, eval.Options{Explain: explain, Warn: warn, Now: at})
			if err != nil {
				return err
			}
			return format(cmd.OutOrStdout(), report)
		},
	}
	b.register(cmd)
	dlog.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "json", "output format: json, yaml or table")
	cmd.Flags().BoolVar(&explain, "explain", false, "show every candidate of each decision and why it won or lost")
	cmd.Flags().StringVar(&now, "now", "", "the `TIME` (RFC 3339) plans are made for (default: now)")
	maxInputFlag(cmd, &maxInput)
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
	return writePoolTable(w, r.Pools)
}

// writePoolTable prints one row per pool: how many VMs each action of its plan takes.
func writePoolTable(w io.Writer, pools []eval.PoolResult) error {
	if len(pools) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nPOOL\tCREATE\tDELETE\tUPDATE\tRESTART\tREPROVISION")
	for _, p := range pools {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", p.Pool, len(p.Create), len(p.Delete), len(p.Update), len(p.Restart), len(p.Reprovision))
	}
	return tw.Flush()
}
