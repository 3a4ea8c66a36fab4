package defaults

import "os"

// TmpfsDir is /dev/shm when it is a writable directory, else the temporary directory: where an
// embedded libvirt's throwaway root is fastest (OpenLibvirt).
func TmpfsDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", ".virt-rules-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}
