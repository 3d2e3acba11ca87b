package service

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/capsem/capsem/core/api"
)

// vmOverheadMB is what a VM costs the host beyond its guest RAM (QEMU,
// the per-VM process, the gateway's processes), as a margin.
const vmOverheadMB = 256

// memAvailable is /proc/meminfo's MemAvailable, in MiB. A test replaces it.
var memAvailable = func() (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: %q: %w", sc.Text(), err)
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo has no MemAvailable")
}

func (s *Service) checkMemory(ramMB int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkMemoryLocked(ramMB)
}

// checkMemoryLocked refuses a VM of ramMB that the host cannot hold: its
// RAM and overhead must fit in what is available, less the RAM of VMs
// still booting (not yet touched, so not yet counted as used).
func (s *Service) checkMemoryLocked(ramMB int) error {
	avail, err := memAvailable()
	if err != nil {
		return nil // not knowable here: the kernel decides
	}
	booting := 0
	for _, v := range s.vms {
		if v.rec.State == api.StateBooting {
			booting += v.rec.RAMMB + vmOverheadMB
		}
	}
	if need := ramMB + vmOverheadMB; need > avail-booting {
		return refuse(http.StatusConflict, "not enough free memory for a VM of %d MB: it needs about %d MB and the host has %d MB available (%d MB of it promised to VMs that are booting); stop a VM or ask for less ram_mb",
			ramMB, need, avail-booting, booting)
	}
	return nil
}
