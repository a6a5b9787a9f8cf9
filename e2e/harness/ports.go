package harness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
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

// Each client on the loopback address gets a block of Nomad's dynamic port
// range of its own (client.min_dynamic_port and max_dynamic_port): clients
// that share an address each hand out the whole range without knowing of
// the others, and with many tests side by side two allocations' ports
// collided a few times a run.
const (
	dynamicPortsLow   = 20000
	dynamicPortsHigh  = 31999
	dynamicBlockPorts = 200
)

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{} // never hand a port out twice in one test binary
)

// freePorts returns n distinct ports on 127.0.0.1 that are free for both TCP
// and UDP (serf listens on both) right now, were not handed out before by
// this process, and are not held by another (reserve).
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
		// Held for the life of the test binary, as portsGiven.
		if _, taken := reserve("port-" + strconv.Itoa(p)); taken {
			continue
		}
		portsGiven[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// dynamicBlock reserves a block of Nomad's dynamic port range that no other
// client of this or another test binary holds, and returns its first and
// last port; release hands it back. ok is false when every block is held
// (the client then shares the whole range, as before there were blocks).
func dynamicBlock() (low, high int, release func(), ok bool) {
	blocks := (dynamicPortsHigh - dynamicPortsLow + 1) / dynamicBlockPorts
	start := rand.IntN(blocks)
	for i := range blocks {
		b := (start + i) % blocks
		r, taken := reserve("dynamic-" + strconv.Itoa(b))
		if r == nil {
			if taken {
				continue
			}
			break // no reservations here
		}
		low = dynamicPortsLow + b*dynamicBlockPorts
		return low, low + dynamicBlockPorts - 1, func() { r.Close() }, true
	}
	return 0, 0, func() {}, false
}

// reservationDir holds one file per port or block; a reservation is an
// exclusive flock(2) on its file, which the kernel drops when the holder
// exits however it exits. Test binaries run side by side (go test -p runs
// the e2e, harness and bench packages at once; other checkouts' tests may
// share the machine), and each only knows its own ports otherwise.
var reservationDir = filepath.Join(os.TempDir(), "nomad-singleton-e2e-ports")

// reserve takes the reservation named name and returns its file (closing
// it releases it), or taken if another holder has it. If reservations
// cannot be made here at all (the directory is not ours to use), it
// returns neither.
func reserve(name string) (f *os.File, taken bool) {
	if err := os.MkdirAll(reservationDir, 0o755); err != nil {
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(reservationDir, name), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, false
	}
	// flock locks belong to an open file description: a second open of the
	// same file in this process conflicts as another process's would.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, errors.Is(err, unix.EWOULDBLOCK)
	}
	return f, false
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
