package engine_test

// The classes of the upstream differential cases (*_upstream_test.go): each case is a fact
// read from KubeVirt's own unit tests or code, written here in this project's words and
// fixtures, and says whether virt-rules agrees with KubeVirt or differs by a documented choice.
const (
	classAgrees  = "agrees"
	classDiffers = "differs by documented choice"
)
