package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCommand() *cobra.Command {
	var b bundleFlags
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the binary's version and the revision of the bundle it serves",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			version := "(devel)"
			if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
				version = info.Main.Version
			}
			eng, err := b.engine(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "virt-rules %s\nbundle %s (%s)\n", version, eng.Revision(), eng.Source())
			return nil
		},
	}
	b.register(cmd)
	return cmd
}
