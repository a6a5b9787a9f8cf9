package harness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ports are drawn from a band that nothing else on the machine hands out on
// its own: below the kernel's ephemeral range (where every outgoing
// connection, from any agent or test, takes its source port) and below
// Nomad's dynamic port range (20000-32000 by default, for allocations). A
// port the kernel picked with :0 is an ephemeral one, and an agent's serf or
// RPC listener started a second later could find it taken by some other
// connection's source port; CI once failed that way.
const (
	portBandLow  = 12000
	portBandHigh = 19999
)

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{} // never hand a port out twice in one test binary
)

// freePorts returns n distinct ports on 127.0.0.1 that are free for both TCP
// and UDP (serf listens on both) right now and were not handed out before by
// this process.
func freePorts(n int) ([]int, error) {
	low, high := portBand()
	portsMu.Lock()
	defer portsMu.Unlock()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries > 20*(high-low+1) {
			return nil, errors.New("find a free port: none free between " + strconv.Itoa(low) + " and " + strconv.Itoa(high))
		}
		p := low + rand.IntN(high-low+1)
		if portsGiven[p] || !portFree(p) {
			continue
		}
		portsGiven[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// portBand is [portBandLow, portBandHigh], kept below the start of the
// kernel's ephemeral range if a machine moved that range down.
func portBand() (int, int) {
	low, high := portBandLow, portBandHigh
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return low, high
	}
	if eph, err := strconv.Atoi(f[0]); err == nil && eph-1 < high {
		high = eph - 1
		if high-low < 1000 {
			low = max(1024, high-1000)
		}
	}
	return low, high
}

func portFree(p int) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", p)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}
