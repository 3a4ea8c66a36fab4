package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// benchReport is bench's -o json, the baseline --compare reads.
type benchReport struct {
	Revision  string               `json:"revision"`
	Rounds    int                  `json:"rounds"`
	Decisions map[string]benchStat `json:"decisions"`
}

// benchStat is how long one decision's evaluations took: their count and percentiles.
type benchStat struct {
	Samples    int     `json:"samples"`
	P50Seconds float64 `json:"p50Seconds"`
	P99Seconds float64 `json:"p99Seconds"`
}

func newBenchCommand() *cobra.Command {
	var (
		b        bundleFlags
		in       inputFlags
		rounds   int
		output   string
		compare  string
		maxRatio float64
		now      string
	)
	cmd := &cobra.Command{
		Use:   "bench [--bundle B] [flags] PATH... | --kubeconfig FILE",
		Short: "Time each decision of a bundle on your own manifests: p50 and p99 per decision",
		Long: `bench decides the objects (manifests, or a live cluster with --kubeconfig) --rounds times,
as eval does, and prints, for each decision (the sections of eval's report:
migrationPolicies, migrationPolicyValidation, migrationTargets, nodeMigratability,
schedulingAffinity, pools, migrationCandidates), how many evaluations were timed and their
p50 and p99; migrationPolicyIndex is preparing the policy set (its index and partial
evaluation), once a round, as the controller does once per policy change. One round first
warms up and is not counted.

-o json writes a baseline; --compare BASELINE.json prints each decision's p50 and p99 over
the baseline's, and --max-ratio R exits 1 when a p50 ratio is above R: run it on the shipped
bundle once, then on a custom bundle, to see what the change costs.

Objects in error (as eval reports them) are not timed: they are listed on stderr once.
Exit status: 0 nothing wrong, 1 a p50 over --max-ratio or some objects in error, 2 the run
could not happen (bad flags, a bundle refused, no input).`,
		Example: `  virt-rules bench -o json examples/migration-policy/ > baseline.json
  virt-rules bench --bundle examples/custom-bundle/virt-rules-custom.tar.gz --compare baseline.json examples/migration-policy/`,
		Args: withStatus(2, in.args),
		RunE: withStatus(2, func(cmd *cobra.Command, paths []string) error {
			if rounds < 1 {
				return fmt.Errorf("--rounds %d: want at least 1", rounds)
			}
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %s: want table or json", output)
			}
			var baseline *benchReport
			if compare != "" {
				data, err := os.ReadFile(compare)
				if err != nil {
					return fmt.Errorf("--compare: %w", err)
				}
				baseline = &benchReport{}
				if err := json.Unmarshal(data, baseline); err != nil {
					return fmt.Errorf("--compare %s: not a bench -o json baseline: %w", compare, err)
				}
			}
			eng, err := b.engine(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			warn := warner(cmd.ErrOrStderr())
			objs, unreadable, at, err := in.readAt(cmd, paths, warn, now)
			if err != nil {
				return err
			}
			samples := map[string][]time.Duration{}
			var inError []*manifest.Error
			opts := eval.Options{Now: at, Candidates: true, Warn: warn}
			for round := 0; round <= rounds; round++ {
				if round == 1 {
					opts.Warn = nil
					opts.Observe = func(decision string, took time.Duration) { samples[decision] = append(samples[decision], took) }
				}
				report, err := eval.Run(cmd.Context(), eng, objs, opts)
				if err != nil {
					return err
				}
				if round == 0 {
					// The objects in error are not timed: said once, after the figures.
					report.AddErrors(unreadable...)
					inError = report.Errors
				}
			}
			r := benchReport{Revision: eng.Revision(), Rounds: rounds, Decisions: map[string]benchStat{}}
			for decision, d := range samples {
				slices.Sort(d)
				r.Decisions[decision] = benchStat{Samples: len(d), P50Seconds: percentile(d, 0.50).Seconds(), P99Seconds: percentile(d, 0.99).Seconds()}
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(r); err != nil {
					return err
				}
			} else if err := writeBenchTable(cmd.OutOrStdout(), r, baseline); err != nil {
				return err
			}
			if baseline != nil && maxRatio > 0 {
				for _, decision := range sortedDecisions(r.Decisions) {
					if ratio := ratioOf(r.Decisions[decision].P50Seconds, baseline.Decisions[decision].P50Seconds); ratio > maxRatio {
						fmt.Fprintf(cmd.ErrOrStderr(), "%s: p50 %.2fx the baseline's, over --max-ratio %.2f\n", decision, ratio, maxRatio)
						return exitStatus(1)
					}
				}
			}
			return objectErrors(cmd.ErrOrStderr(), inError)
		}),
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &statusError{status: 2, err: err} })
	b.register(cmd)
	in.register(cmd, true)
	cmd.Flags().IntVar(&rounds, "rounds", 20, "decide every object this many times (after one warm-up round)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, or json (a baseline for --compare)")
	cmd.Flags().StringVar(&compare, "compare", "", "print each decision's p50 and p99 over those of this bench -o json `FILE`")
	cmd.Flags().Float64Var(&maxRatio, "max-ratio", 0, "with --compare, exit 1 when a decision's p50 is more than `R` times the baseline's (0: never)")
	cmd.Flags().StringVar(&now, "now", "", "the `TIME` (RFC 3339) plans are made for (default: now)")
	return cmd
}

// percentile is the q-quantile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func ratioOf(value, base float64) float64 {
	if base <= 0 {
		return math.NaN()
	}
	return value / base
}

func sortedDecisions(m map[string]benchStat) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func writeBenchTable(w io.Writer, r benchReport, baseline *benchReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "DECISION\tSAMPLES\tP50\tP99"
	if baseline != nil {
		header += "\tBASE P50\tBASE P99\tP50 RATIO\tP99 RATIO"
	}
	fmt.Fprintln(tw, header)
	for _, decision := range sortedDecisions(r.Decisions) {
		s := r.Decisions[decision]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s", decision, s.Samples, seconds(s.P50Seconds), seconds(s.P99Seconds))
		if baseline != nil {
			if base, ok := baseline.Decisions[decision]; ok {
				fmt.Fprintf(tw, "\t%s\t%s\t%.2fx\t%.2fx", seconds(base.P50Seconds), seconds(base.P99Seconds),
					ratioOf(s.P50Seconds, base.P50Seconds), ratioOf(s.P99Seconds, base.P99Seconds))
			} else {
				fmt.Fprint(tw, "\t-\t-\t-\t-")
			}
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}
