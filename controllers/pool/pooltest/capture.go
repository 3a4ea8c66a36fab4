// Package pooltest holds what tests share about the pool controller's captured objects
// (controllers/pool/testdata/capture-*.json: a pool VM and its VMI as the test cluster's
// KubeVirt made them).
package pooltest

import (
	"bytes"
	"fmt"
	"regexp"
)

// uuid matches the UIDs in a captured object: its own, its owner's, its pods'.
var uuid = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// Copy is captured object data as the i-th of a pool's objects: its VM's name ("cap-1",
// wherever it appears: name, labels, revision names) and every UID its own, of the same length.
func Copy(data []byte, i int) []byte {
	data = bytes.ReplaceAll(data, []byte(`cap-1`), fmt.Appendf(nil, "c%04d", i))
	return uuid.ReplaceAllFunc(data, func(u []byte) []byte {
		return fmt.Appendf(nil, "%s%012d", u[:24], i)
	})
}
