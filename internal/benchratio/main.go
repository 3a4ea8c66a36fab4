// Command benchratio reads `go test -bench` output on stdin, echoes it, then prints how many
// times slower the engine is than the native Go reference: for every pair of sub-benchmarks
// that differ only in a last path element `rego` versus `go`, the ratio of their ns/op
// (the median when a benchmark ran several times, as with -count). A pair `rego` versus
// `floor` is the engine's whole path against a physical floor measured in the same run
// (libvirt defining the same domain), printed in a table of its own. Pairs whose both sides
// report cpu-ns/op (process CPU time per iteration, for an engine side that runs on several
// goroutines) get the ratio of those in a table of its own too.
//
//	go test -run '^$' -bench . -benchmem ./engine/... | go run ./internal/benchratio
//
// It exits non-zero when the benchmarks failed, so a pipeline reports the failure.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// benchLine matches a result line: name (with the -GOMAXPROCS suffix), iterations, ns/op.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([0-9.e+]+) ns/op`)

// cpuMetric matches the CPU time per iteration a benchmark reports beside ns/op (its wall
// time), for a side that runs on several goroutines.
var cpuMetric = regexp.MustCompile(`\s([0-9.e+]+) cpu-ns/op`)

// pair is one benchmark measured on both sides.
type pair struct {
	name   string // the common path, without the last element
	rego   []float64
	native []float64 // the `go` (or `floor`) side
	floor  bool      // the other side is a floor, not the Go reference
	// regoCPU and nativeCPU are the sides' cpu-ns/op, when they report it.
	regoCPU, nativeCPU []float64
}

func main() {
	pairs, failed, err := read(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchratio: read benchmarks:", err)
		os.Exit(1)
	}
	printRatios(os.Stdout, pairs)
	if failed {
		fmt.Fprintln(os.Stderr, "benchratio: the benchmarks failed")
		os.Exit(1)
	}
}

// read echoes r to echo line by line and collects the rego/go pairs, in order of first
// appearance. failed tells whether the output reports a failure.
func read(r io.Reader, echo io.Writer) (pairs []*pair, failed bool, err error) {
	byName := map[string]*pair{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(echo, line)
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "panic:") {
			failed = true
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ns, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		name, side, ok := cutLast(m[1])
		if !ok || (side != "rego" && side != "go" && side != "floor") {
			continue
		}
		p := byName[name]
		if p == nil {
			p = &pair{name: name}
			byName[name] = p
			pairs = append(pairs, p)
		}
		p.floor = p.floor || side == "floor"
		cpu := -1.0
		if c := cpuMetric.FindStringSubmatch(line); c != nil {
			cpu, _ = strconv.ParseFloat(c[1], 64)
		}
		if side == "rego" {
			p.rego = append(p.rego, ns)
			if cpu >= 0 {
				p.regoCPU = append(p.regoCPU, cpu)
			}
		} else {
			p.native = append(p.native, ns)
			if cpu >= 0 {
				p.nativeCPU = append(p.nativeCPU, cpu)
			}
		}
	}
	return pairs, failed, sc.Err()
}

func cutLast(name string) (prefix, last string, ok bool) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func printRatios(w io.Writer, pairs []*pair) {
	table(w, pairs, false, "rego/go: engine ns/op over the Go reference's ns/op, same run (below 1: the engine is faster)", "go")
	if slices.ContainsFunc(pairs, (*pair).hasCPU) {
		cpuTable(w, pairs)
	}
	if slices.ContainsFunc(pairs, func(p *pair) bool { return p.floor }) {
		table(w, pairs, true, "rego/floor: the whole path's ns/op over its physical floor's (libvirt alone), same run", "floor")
	}
}

func table(w io.Writer, pairs []*pair, floor bool, title, other string) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "benchmark\trego ns/op\t%s ns/op\trego/%s\n", other, other)
	complete := 0
	for _, p := range pairs {
		if p.floor != floor || len(p.rego) == 0 || len(p.native) == 0 {
			continue
		}
		complete++
		r, g := median(p.rego), median(p.native)
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\n", p.name, r, g, r/g)
	}
	if complete == 0 {
		fmt.Fprintf(tw, "(no rego/%s pairs)\n", other)
	}
	tw.Flush()
}

func (p *pair) hasCPU() bool { return len(p.regoCPU) > 0 && len(p.nativeCPU) > 0 }

// cpuTable prints the CPU time ratio of the pairs whose both sides report cpu-ns/op.
func cpuTable(w io.Writer, pairs []*pair) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "rego/go CPU: engine cpu-ns/op over the Go reference's (process CPU time, every goroutine), same run")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "benchmark\trego cpu-ns/op\tgo cpu-ns/op\trego/go CPU\n")
	for _, p := range pairs {
		if !p.hasCPU() {
			continue
		}
		r, g := median(p.regoCPU), median(p.nativeCPU)
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\n", p.name, r, g, r/g)
	}
	tw.Flush()
}
