//go:build libvirt

// Command cpumap writes libvirt's cpu_map, as the installed libvirt reports it through its own
// API (internal/cpumap), to the file the CPU baseline decision reads as
// data.virtrules.node.baseline.cpu_map (`make cpu-map`):
//
//	go run -tags=libvirt ./hack/cpumap -o rego/virtrules/node/baseline/cpu_map/data.json
//
// Without -o, or with -o -, it writes to standard output.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/virt-rules/virt-rules/internal/cpumap"
)

func main() {
	out := flag.String("o", "-", "the file to write (its directory is created); - for standard output")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: cpumap [-o FILE]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out); err != nil {
		fmt.Fprintln(os.Stderr, "cpumap:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string) error {
	start := time.Now()
	l, err := cpumap.Open(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	table, err := l.Table(ctx)
	if err != nil {
		return err
	}
	b, err := table.Marshal()
	if err != nil {
		return err
	}
	if out == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return err
	}
	fmt.Fprintf(os.Stderr, "cpumap: %s: libvirt %s, %d %s models, %d bytes, in %s\n",
		out, table.Libvirt, len(table.Models[cpumap.Arch]), cpumap.Arch, len(b), time.Since(start).Round(time.Millisecond))
	return nil
}
