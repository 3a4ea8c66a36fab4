// Command pause is the pod sandbox's one process on a real node of the test cluster
// (AddRealNode), as registry.k8s.io/pause is on a real cluster: it holds the pod's namespaces
// open, reaps the zombies a pod's containers leave to it as PID 1, and exits 0 on SIGTERM or
// SIGINT. It is built at test time and packed into an image offline, since the test cluster
// pulls nothing.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap waits for every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
