package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/virt-rules/virt-rules/internal/webhookcerts"
)

func newWebhooksCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Manage virt-rules' admission webhook configurations",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newWebhooksRemoveCommand())
	return cmd
}

func newWebhooksRemoveCommand() *cobra.Command {
	var (
		kubeconfig     string
		configurations []string
		timeout        time.Duration
		logLevel       string
	)
	cmd := &cobra.Command{
		Use:   "remove",
		Short: "Delete virt-rules' webhook configurations, so that no webhook is left pointing at a removed controller",
		Long: `remove deletes the webhook configurations named by --webhook-configurations (the same
flag and default as the controller's: every webhook configuration the kit installs) and
nothing else. One already absent counts as removed, so it can run again. The Helm chart runs it
as a pre-delete hook (a Job with a service account allowed to delete those names only), so
that helm uninstall removes every virt-rules webhook configuration before the controller and
its Service.`,
		Example: `  virt-rules webhooks remove --kubeconfig ~/.kube/config
  virt-rules webhooks remove --webhook-configurations validating/virt-rules-validating,mutating/virt-rules-mutating`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			refs, err := parseWebhookConfigurations(configurations)
			if err != nil {
				return err
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: want more than 0", timeout)
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("kubernetes client: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return removeWebhookConfigurations(ctx, cs, refs, logger)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig `FILE` for running outside a cluster (default: in-cluster, or $KUBECONFIG)")
	f.StringSliceVar(&configurations, "webhook-configurations", defaultWebhookConfigurations, "`KIND/NAME`s (validating or mutating) of the webhook configurations to delete; absent ones are skipped")
	f.DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// parseWebhookConfigurations reads --webhook-configurations' KIND/NAMEs.
func parseWebhookConfigurations(refs []string) ([]webhookcerts.Configuration, error) {
	out := make([]webhookcerts.Configuration, 0, len(refs))
	for _, c := range refs {
		kind, name, ok := strings.Cut(c, "/")
		if !ok || (kind != string(webhookcerts.Validating) && kind != string(webhookcerts.Mutating)) || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--webhook-configurations: %q: want validating/NAME or mutating/NAME", c)
		}
		out = append(out, webhookcerts.Configuration{Kind: webhookcerts.Kind(kind), Name: name})
	}
	return out, nil
}

// removeWebhookConfigurations deletes each of refs; one already absent is not an error. It
// tries every one and returns every failure.
func removeWebhookConfigurations(ctx context.Context, cs kubernetes.Interface, refs []webhookcerts.Configuration, logger *slog.Logger) error {
	api := cs.AdmissionregistrationV1()
	var errs []error
	for _, ref := range refs {
		var err error
		switch ref.Kind {
		case webhookcerts.Validating:
			err = api.ValidatingWebhookConfigurations().Delete(ctx, ref.Name, metav1.DeleteOptions{})
		case webhookcerts.Mutating:
			err = api.MutatingWebhookConfigurations().Delete(ctx, ref.Name, metav1.DeleteOptions{})
		default:
			err = fmt.Errorf("want kind validating or mutating")
		}
		switch {
		case apierrors.IsNotFound(err):
			logger.InfoContext(ctx, "webhook configuration already absent", "kind", string(ref.Kind), "name", ref.Name)
		case err != nil:
			errs = append(errs, fmt.Errorf("delete %s webhook configuration %s: %w", ref.Kind, ref.Name, err))
		default:
			logger.InfoContext(ctx, "webhook configuration deleted", "kind", string(ref.Kind), "name", ref.Name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		logger.ErrorContext(ctx, "webhook configurations left", "error", err)
		return err
	}
	return nil
}
