// Command virt-rules serves the virt-rules decisions: offline over manifests (eval) and,
// in later commands, in a cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if status := exitStatus(0); errors.As(err, &status) {
		os.Exit(int(status))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		if se := (*statusError)(nil); errors.As(err, &se) {
			os.Exit(se.status)
		}
		os.Exit(1)
	}
}
