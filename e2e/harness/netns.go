package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// netLab is the private network of an Agent with AgentOptions.Netns: a
// bridge in the host's network namespace carrying the server's address, and
// one network namespace per client, joined to the bridge by a veth pair.
// Traffic stays on the bridge's subnet, which is chosen unused on the host.
// Cutting a client's veth at the bridge partitions it from the server (and
// from the test, which reaches the client's HTTP API over the bridge), while
// both sides keep running; healing brings the link back.
//
//	host netns:  server (10.231.X.1 on sgl<X>b) ── sgl<X>h<i> ═╗
//	client i:    nomad client (10.231.X.<10+i> on sgl<X>c<i>) ═╝ (netns sgl-<pid>-<X>-<i>)
type netLab struct {
	subnet int    // X in 10.231.X.0/24
	bridge string // sgl<X>b
	hostIP string // the server's address, on the bridge

	mu    sync.Mutex
	links []*nsLink
}

// nsLink is one client's namespace and link.
type nsLink struct {
	netns    string // name under /run/netns
	hostVeth string // bridge side; down = partitioned
	nsVeth   string // inside netns
	ip       string
	cut      bool
}

// Names and addresses of the lab. Interface names are at most 15 bytes.
const (
	netLabPrefix   = "sgl"
	netLabFirst    = 10 // client i gets 10.231.X.(netLabFirst+i)
	netLabSubnetHi = 231
)

var netLabMu sync.Mutex // one lab is set up at a time: subnet choice is racy otherwise

// newNetLab creates the bridge and n client namespaces. Stale labs of dead
// test processes are removed first. On error everything created is removed.
func newNetLab(n int) (lab *netLab, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("network namespaces need root (AgentOptions.Netns)")
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("AgentOptions.Netns needs %s (Debian packages iproute2, util-linux): %w", tool, err)
		}
	}
	netLabMu.Lock()
	defer netLabMu.Unlock()
	sweepStaleNetLabs()

	x, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	lab = &netLab{subnet: x, bridge: fmt.Sprintf("%s%db", netLabPrefix, x), hostIP: fmt.Sprintf("10.%d.%d.1", netLabSubnetHi, x)}
	defer func() {
		if err != nil {
			lab.teardown()
			lab = nil
		}
	}()
	// The alias records the owner, for sweepStaleNetLabs.
	if err := runIP("link", "add", lab.bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	if err := runIP("link", "set", lab.bridge, "alias", fmt.Sprintf("e2e-harness pid=%d", os.Getpid()), "up"); err != nil {
		return nil, err
	}
	if err := runIP("addr", "add", lab.hostIP+"/24", "dev", lab.bridge); err != nil {
		return nil, err
	}
	for i := 1; i <= n; i++ {
		l := &nsLink{
			netns:    fmt.Sprintf("%s-%d-%d-%d", netLabPrefix, os.Getpid(), x, i),
			hostVeth: fmt.Sprintf("%s%dh%d", netLabPrefix, x, i),
			nsVeth:   fmt.Sprintf("%s%dc%d", netLabPrefix, x, i),
			ip:       fmt.Sprintf("10.%d.%d.%d", netLabSubnetHi, x, netLabFirst+i),
		}
		lab.links = append(lab.links, l)
		steps := [][]string{
			{"netns", "add", l.netns},
			{"link", "add", l.hostVeth, "type", "veth", "peer", "name", l.nsVeth},
			{"link", "set", l.nsVeth, "netns", l.netns},
			{"link", "set", l.hostVeth, "master", lab.bridge, "up"},
			{"-n", l.netns, "addr", "add", l.ip + "/24", "dev", l.nsVeth},
			{"-n", l.netns, "link", "set", l.nsVeth, "up"},
			{"-n", l.netns, "link", "set", "lo", "up"},
		}
		for _, s := range steps {
			if err := runIP(s...); err != nil {
				return nil, err
			}
		}
	}
	return lab, nil
}

// freeSubnet picks X such that no host route or address uses 10.231.X.0/24.
func freeSubnet() (int, error) {
	out, err := exec.Command("ip", "-4", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ip addr show: %v: %s", err, out)
	}
	routes, err := exec.Command("ip", "-4", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ip route show: %v: %s", err, routes)
	}
	used := string(out) + string(routes)
	start := os.Getpid() % 200
	for k := range 250 {
		x := 1 + (start+k)%250
		if !strings.Contains(used, fmt.Sprintf("10.%d.%d.", netLabSubnetHi, x)) {
			return x, nil
		}
	}
	return 0, fmt.Errorf("no free 10.%d.X.0/24 subnet on this host", netLabSubnetHi)
}

// sweepStaleNetLabs removes the namespaces and bridges of test processes
// that died without cleanup (e.g. killed by -timeout).
func sweepStaleNetLabs() {
	dead := func(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == syscall.ESRCH }
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			parts := strings.Split(e.Name(), "-")
			if len(parts) == 4 && parts[0] == netLabPrefix {
				if pid, err := strconv.Atoi(parts[1]); err == nil && dead(pid) {
					_ = runIP("netns", "delete", e.Name())
				}
			}
		}
	}
	out, err := exec.Command("ip", "-o", "link", "show", "type", "bridge").CombinedOutput()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		// "7: sgl12b: <...> ...\    alias e2e-harness pid=123"
		fields := strings.Fields(line)
		if len(fields) < 2 || !strings.HasPrefix(fields[1], netLabPrefix) {
			continue
		}
		_, after, ok := strings.Cut(line, "alias e2e-harness pid=")
		if !ok {
			continue
		}
		if pid, err := strconv.Atoi(strings.Fields(after)[0]); err == nil && dead(pid) {
			_ = runIP("link", "delete", strings.TrimSuffix(fields[1], ":"))
		}
	}
}

// teardown deletes the namespaces (which takes their veth pairs along) and
// the bridge. Errors are returned, joined; it keeps going past them.
func (lab *netLab) teardown() error {
	lab.mu.Lock()
	defer lab.mu.Unlock()
	var errs []error
	// Deleting a namespace takes its veth end, and so the pair, along, but
	// the kernel may finish that after `ip netns delete` returns.
	for _, l := range lab.links {
		if _, err := os.Stat("/run/netns/" + l.netns); err == nil {
			if err := runIP("netns", "delete", l.netns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, l := range lab.links {
		if err := deleteLink(l.hostVeth); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteLink(lab.bridge); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// deleteLink deletes a host link unless it is (or goes) away by itself.
func deleteLink(name string) error {
	if err := runIP("link", "delete", name); err != nil && linkExists(name) {
		return err
	}
	return nil
}

func linkExists(name string) bool { return exec.Command("ip", "link", "show", name).Run() == nil }

// setCut takes the host side of a client's veth down (cut) or up (heal).
// A downed link drops every packet both ways: connections hang until their
// own timeouts, as in a real partition, rather than being reset.
func (lab *netLab) setCut(l *nsLink, cut bool) error {
	lab.mu.Lock()
	defer lab.mu.Unlock()
	state := map[bool]string{true: "down", false: "up"}[cut]
	if err := runIP("link", "set", l.hostVeth, state); err != nil {
		return err
	}
	l.cut = cut
	return nil
}

func (lab *netLab) isCut(l *nsLink) bool {
	lab.mu.Lock()
	defer lab.mu.Unlock()
	return l.cut
}

func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
