package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cpuSnap is a reading of the machine's CPU time and of the part this
// process and its descendants (a ferretdb or PostgreSQL upstream) used, in
// clock ticks, from /proc. The rest is other tenants' load: the machine
// this runs on is shared.
type cpuSnap struct{ busy, total, ours float64 }

func readCPU() cpuSnap {
	var s cpuSnap
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, v := range strings.Fields(line)[1:] {
		if i >= 8 { // guest time is counted in user time already
			break
		}
		x, _ := strconv.ParseFloat(v, 64)
		s.total += x
		if i != 3 && i != 4 { // idle, iowait
			s.busy += x
		}
	}
	// ours: every process whose ancestry leads to this one
	parent := map[int]int{}
	ticks := map[int]float64{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		_, rest, ok := strings.Cut(string(b), ") ") // after "pid (comm"
		if !ok {
			continue
		}
		fs := strings.Fields(rest) // state ppid ... utime(12) stime(13)
		if len(fs) < 14 {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		parent[pid], _ = strconv.Atoi(fs[1])
		u, _ := strconv.ParseFloat(fs[11], 64)
		st, _ := strconv.ParseFloat(fs[12], 64)
		ticks[pid] = u + st
	}
	self := os.Getpid()
	for pid, t := range ticks {
		for p, hops := pid, 0; p > 1 && hops < 64; p, hops = parent[p], hops+1 {
			if p == self {
				s.ours += t
				break
			}
		}
	}
	return s
}

// othersCores is how many of the machine's cores other processes kept
// busy, on average, between a and b (an exited descendant's time is
// lost, so short-lived helpers count as others').
func othersCores(a, b cpuSnap, cores int) float64 {
	if b.total <= a.total {
		return 0
	}
	others := (b.busy - a.busy) - (b.ours - a.ours)
	return max(others, 0) / (b.total - a.total) * float64(cores)
}
