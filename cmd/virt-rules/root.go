package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/virt-rules/virt-rules/engine"
)

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "virt-rules",
		Short: "KubeVirt decisions as Rego, evaluated by an embedded OPA",
		Long: `virt-rules makes the decisions KubeVirt hard-codes (which MigrationPolicy a VMI obeys,
and more) with Rego rules that cluster admins can change by shipping a bundle.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newEvalCommand(), newControllerCommand(), newVersionCommand())
	root.AddCommand(newDefaulterCommand(), newDefaultCommand())
	root.AddCommand(newDiffCommand(), newBenchCommand(), newWebhooksCommand())
	return root
}

// bundleFlags are the flags every command that serves decisions shares.
type bundleFlags struct {
	path            string
	verificationKey string
	fileLimit       int64
	sizeLimit       int64
	decision, trial engine.Budget
}

func (f *bundleFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "bundle", "", "serve the Rego bundle at `PATH` (a directory or a .tar.gz built by opa build) instead of the embedded one")
	cmd.Flags().StringVar(&f.verificationKey, "bundle-verification-key", "", "refuse any --bundle (or --bundle-url) bundle not signed by the private key of this PEM public key `FILE` (opa build --signing-key)")
	cmd.Flags().Int64Var(&f.fileLimit, "bundle-file-limit", engine.DefaultBundleFileLimit, "refuse any --bundle (or --bundle-url) bundle with a file of more than `N` bytes once decompressed, before reading it whole")
	cmd.Flags().Int64Var(&f.sizeLimit, "bundle-size-limit", engine.DefaultBundleSizeLimit, "refuse any --bundle (or --bundle-url) bundle whose files hold more than `N` bytes together once decompressed, before they are all read")
	cmd.Flags().DurationVar(&f.decision.Timeout, "decision-timeout", engine.DefaultDecisionBudget.Timeout, "stop any one evaluation of a decision after this long (0: never)")
	cmd.Flags().Int64Var(&f.decision.Memory, "decision-memory-limit", engine.DefaultDecisionBudget.Memory, "stop any one evaluation of a decision once the heap has grown by more than `N` bytes while it ran (0: never)")
	cmd.Flags().DurationVar(&f.trial.Timeout, "bundle-trial-timeout", engine.DefaultTrialBudget.Timeout, "refuse a bundle (embedded, --bundle or --bundle-url) when one of its decisions on the representative inputs shipped with the binary runs longer (0: no bound)")
	cmd.Flags().Int64Var(&f.trial.Memory, "bundle-trial-memory-limit", engine.DefaultTrialBudget.Memory, "refuse a bundle when one of its decisions on the representative inputs grows the heap by more than `N` bytes (0: no bound)")
}

// options are the engine options the flags ask for.
func (f *bundleFlags) options() []engine.Option {
	opts := []engine.Option{engine.WithBundleFileLimit(f.fileLimit), engine.WithBundleSizeLimit(f.sizeLimit),
		engine.WithDecisionBudget(f.decision), engine.WithTrialBudget(f.trial)}
	if f.path != "" {
		opts = append(opts, engine.WithBundlePath(f.path))
	}
	if f.verificationKey != "" {
		opts = append(opts, engine.WithVerificationKey(f.verificationKey))
	}
	return opts
}

// engine builds an engine for a one-shot command, logging warnings to logOut.
func (f *bundleFlags) engine(ctx context.Context, logOut io.Writer, extra ...engine.Option) (*engine.Engine, error) {
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return engine.New(ctx, append(append(f.options(), engine.WithLogger(logger)), extra...)...)
}
