// Command benchratio reads `go test -bench` output on stdin, echoes it, then prints how many
// times slower the engine is than the native Go reference: for every pair of sub-benchmarks
// that differ only in a last path element `rego` versus `go`, the ratio of their ns/op
// (the median when a benchmark ran several times, as with -count).
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

// pair is one benchmark measured on both sides.
type pair struct {
	name   string // the common path, without the last element
	rego   []float64
	native []float64 // the `go` side
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
		if !ok || (side != "rego" && side != "go") {
			continue
		}
		p := byName[name]
		if p == nil {
			p = &pair{name: name}
			byName[name] = p
			pairs = append(pairs, p)
		}
		if side == "rego" {
			p.rego = append(p.rego, ns)
		} else {
			p.native = append(p.native, ns)
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
	fmt.Fprintln(w)
	fmt.Fprintln(w, "rego/go: engine ns/op over the Go reference's ns/op, same run (below 1: the engine is faster)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\trego ns/op\tgo ns/op\trego/go")
	complete := 0
	for _, p := range pairs {
		if len(p.rego) == 0 || len(p.native) == 0 {
			continue
		}
		complete++
		r, g := median(p.rego), median(p.native)
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\n", p.name, r, g, r/g)
	}
	if complete == 0 {
		fmt.Fprintln(tw, "(no rego/go pairs)")
	}
	tw.Flush()
}
