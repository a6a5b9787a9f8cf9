package harness

// A real Docker engine for the docker-driver tests: one private dockerd per
// test binary, in a temporary directory of its own (data root, exec root,
// socket, managed containerd), never the machine's engine. It starts with no
// bridge and no iptables rules (--bridge=none --iptables=false
// --ip-masq=false): a default dockerd sets the FORWARD policy to DROP and
// makes a docker0 bridge, which would break the ip-netns partition tests.
// Containers therefore use network_mode "host" (or "none").
//
// No registry is reachable, so the test image is made with `docker import`
// from a root filesystem the harness assembles: Debian's static busybox
// (/bin/busybox, busybox-static) with its applet links, bin/lock and the
// e2e testworkload. Its tag is a content hash, never "latest", so Nomad's
// docker driver finds it locally and never pulls; the plugin config turns
// image GC off so nothing deletes it.
//
// Usage:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) } // once per package
//
//	d := harness.StartDocker(t)
//	opts := harness.AgentOptions{Dev: true, Docker: d}
//	a := harness.StartAgent(t, opts)
//	// jobspecs: driver = "docker", config { image = d.Image, network_mode = "host" }
//	out := d.CLI(t, "ps", "-a")

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// Paths inside the test image (Docker.Image).
const (
	// ImageLockPath is bin/lock in the image, as in the examples' entrypoints.
	ImageLockPath = "/usr/local/bin/lock"
	// ImageWorkloadPath is the e2e testworkload in the image.
	ImageWorkloadPath = "/usr/local/bin/testworkload"
	// ImageRepository is the test image's repository name; its tag is a
	// content hash.
	ImageRepository = "singleton-e2e"
	// EnvDockerd and EnvBusybox override where the harness finds dockerd and
	// the static busybox.
	EnvDockerd = "E2E_DOCKERD"
	EnvBusybox = "E2E_BUSYBOX"
	// DockerStartTimeout bounds dockerd's start until `docker info` answers.
	DockerStartTimeout = 90 * time.Second
	// dockerStopTimeout bounds dockerd's graceful stop before SIGKILL.
	dockerStopTimeout = 45 * time.Second
)

// dockerFix is what a failure message tells the user to do.
const dockerFix = "install Docker and a static busybox (as root: scripts/ensure-docker.sh, " +
	"or apt-get install -y docker.io busybox-static; make test and make e2e do it)"

// Docker is the test binary's private Docker engine with the test image
// built. Get it with StartDocker; Main stops it when the tests are done.
type Docker struct {
	// Endpoint is the engine's address, "unix://<Dir>/docker.sock": the
	// docker plugin's endpoint and `docker -H`.
	Endpoint string
	// Image is the test image "singleton-e2e:<content hash>" holding
	// /bin/busybox (sh and the other applets), ImageLockPath and
	// ImageWorkloadPath.
	Image string
	// Dir is the engine's private directory.
	Dir string

	cli   string // docker CLI
	cmd   *exec.Cmd
	done  chan struct{}
	log   string // dockerd's log file
	ns    string // containerd namespace
	start time.Time
}

var (
	dockerOnce sync.Once
	dockerMu   sync.Mutex
	docker     *Docker
	dockerErr  error
)

// StartDocker returns the test binary's Docker engine, starting it and
// building the test image on first use. It fails the test, naming the fix,
// if Docker or busybox is missing or the engine cannot start. The engine
// outlives the test: Main stops it (and, should the binary die first, it
// gets SIGTERM through Pdeathsig).
func StartDocker(t testing.TB) *Docker {
	t.Helper()
	SkipOutsideSmoke(t)
	lockBin := LockBin(t)
	workload := BuildTestWorkload(t)
	dockerOnce.Do(func() {
		d, err := startDocker()
		if err == nil {
			dockerMu.Lock()
			docker = d
			dockerMu.Unlock()
			err = d.buildImage(lockBin, workload)
		}
		dockerErr = err
	})
	if dockerErr != nil {
		t.Fatalf("harness: docker: %v", dockerErr)
	}
	return docker
}

// Main runs the package's tests and then stops the Docker engine, if one
// was started: call it from TestMain as os.Exit(harness.Main(m)). A
// container, containerd or shim left behind makes the run fail.
func Main(m *testing.M) int {
	code := m.Run()
	dockerMu.Lock()
	d := docker
	dockerMu.Unlock()
	if d != nil {
		if err := d.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "harness: docker: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

func findDockerd() (string, error) {
	if p := os.Getenv(EnvDockerd); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("dockerd"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/dockerd", "/usr/bin/dockerd"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("dockerd not found on PATH or in /usr/sbin: %s", dockerFix)
}

// findDockerCLI prefers the CLI installed beside dockerd (same package,
// same API version), then PATH.
func findDockerCLI(dockerd string) (string, error) {
	for _, dir := range []string{"/usr/bin", filepath.Dir(dockerd)} {
		p := filepath.Join(dir, "docker")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("docker"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("docker CLI not found: %s", dockerFix)
}

func startDocker() (*Docker, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a private dockerd needs root: run the e2e tests as root (CI does)")
	}
	dockerd, err := findDockerd()
	if err != nil {
		return nil, err
	}
	cli, err := findDockerCLI(dockerd)
	if err != nil {
		return nil, err
	}
	// Short: the socket paths below it must stay under 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "dkr")
	if err != nil {
		return nil, err
	}
	d := &Docker{
		Dir: dir, Endpoint: "unix://" + filepath.Join(dir, "docker.sock"), cli: cli,
		done: make(chan struct{}), log: filepath.Join(dir, "dockerd.log"),
		// Our own containerd namespace, should containerd ever be shared.
		ns: "singleton-e2e-" + strconv.Itoa(os.Getpid()),
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	d.cmd = exec.Command(dockerd,
		// Never without these three: see the file comment.
		"--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false",
		"--config-file", filepath.Join(dir, "daemon.json"),
		"--data-root", filepath.Join(dir, "root"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"-H", d.Endpoint,
		"--containerd-namespace", d.ns,
		"--containerd-plugins-namespace", d.ns+"-plugins",
		"--log-level", "warn",
	)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.Env = append(filterEnv(os.Environ(), "DOCKER_"), "DOCKER_CONFIG="+filepath.Join(dir, "cli"))
	// Forked from the pinned thread: if the test binary dies before Main
	// stops the engine, dockerd gets SIGTERM and stops its containers.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	d.start = time.Now()
	if err := proctest.StartPinned(d.cmd); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %v (%s)", dockerd, err, dockerFix)
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()

	deadline := time.Now().Add(DockerStartTimeout)
	for {
		out, err := d.TryCLI("info", "--format", "{{.ServerVersion}} {{.Driver}} {{.CgroupDriver}}")
		if err == nil {
			fmt.Fprintf(os.Stderr, "harness: docker: private dockerd %s (pid %d, %s) ready in %s\n",
				strings.TrimSpace(out), d.cmd.Process.Pid, dir, time.Since(d.start).Round(time.Millisecond))
			return d, nil
		}
		select {
		case <-d.done:
			tail := fileTail(d.log, 30)
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("dockerd exited during start (%s); its log:\n%s", dockerFix, tail)
		default:
		}
		if time.Now().After(deadline) {
			serr := d.stop()
			return nil, fmt.Errorf("dockerd did not answer `docker info` within %s (last: %v %s; stop: %v); its log:\n%s",
				DockerStartTimeout, err, strings.TrimSpace(out), serr, fileTail(d.log, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TryCLI runs `docker -H Endpoint args...`, bounded by CLITimeout, and
// returns its combined output.
func (d *Docker) TryCLI(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), CLITimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cli, append([]string{"-H", d.Endpoint}, args...)...)
	cmd.Env = append(filterEnv(os.Environ(), "DOCKER_"), "DOCKER_CONFIG="+filepath.Join(d.Dir, "cli"))
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %s: %w", CLITimeout, err)
	}
	return string(out), err
}

// CLI is TryCLI that fails the test on a non-zero exit.
func (d *Docker) CLI(t testing.TB, args ...string) string {
	t.Helper()
	out, err := d.TryCLI(args...)
	if err != nil {
		t.Fatalf("harness: docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// PluginConfig is the agent config block that points Nomad's docker driver
// at this engine: bind mounts allowed (volumes), image GC off (nobody can
// pull the image back) and dangling-container GC off (one engine serves
// every agent of the test binary).
func (d *Docker) PluginConfig() string {
	return fmt.Sprintf(`plugin "docker" {
  config {
    endpoint = %q
    volumes {
      enabled = true
    }
    gc {
      image = false
      dangling_containers {
        enabled = false
      }
    }
  }
}`, d.Endpoint)
}

// Container is one container as `docker ps` shows it.
type Container struct {
	ID, Name, State string
	// PID is the host PID of its first process (0 unless running).
	PID int
}

// TaskContainers lists the containers (running or not) that Nomad's docker
// driver made for the allocation's task, newest first.
func (d *Docker) TaskContainers(t testing.TB, allocID, task string) []Container {
	t.Helper()
	out := d.CLI(t, "ps", "-a", "--no-trunc", "--filter", "label=com.hashicorp.nomad.alloc_id="+allocID,
		"--format", "{{.ID}} {{.Names}} {{.State}}")
	var cs []Container
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[1] != task+"-"+allocID {
			continue
		}
		c := Container{ID: f[0], Name: f[1], State: f[2]}
		if c.State == "running" {
			pid, err := d.TryCLI("inspect", "--format", "{{.State.Pid}}", c.ID)
			if err == nil {
				c.PID, _ = strconv.Atoi(strings.TrimSpace(pid))
			}
		}
		cs = append(cs, c)
	}
	return cs
}

// Freeze stops the engine's dockerd by its PID (SIGSTOP): its API hangs,
// while its containers, which containerd and their shims run, run on. The
// returned thaw (SIGCONT) is also registered as a cleanup. The engine is
// shared by every test of the binary: a test that freezes it must not run
// in parallel with others that use it.
func (d *Docker) Freeze(t testing.TB) (thaw func()) {
	t.Helper()
	pid := d.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("harness: SIGSTOP dockerd (pid %d): %v", pid, err)
	}
	var once sync.Once
	thaw = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	return thaw
}

// stop removes every container, stops dockerd (SIGTERM, bounded, then
// SIGKILL) by its PID, kills any containerd or shim of ours left behind
// (an error), unmounts what is left below Dir and removes it.
func (d *Docker) stop() error {
	var errs []error
	pid := d.cmd.Process.Pid
	select {
	case <-d.done:
		errs = append(errs, fmt.Errorf("dockerd (pid %d) had already exited; log tail:\n%s", pid, fileTail(d.log, 20)))
	default:
		if out, err := d.TryCLI("ps", "-aq"); err != nil {
			errs = append(errs, fmt.Errorf("docker ps: %v: %s", err, out))
		} else if ids := strings.Fields(out); len(ids) > 0 {
			if out, err := d.TryCLI(append([]string{"rm", "-f", "-v"}, ids...)...); err != nil {
				errs = append(errs, fmt.Errorf("docker rm -f: %v: %s", err, out))
			}
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(dockerStopTimeout):
			errs = append(errs, fmt.Errorf("dockerd (pid %d) still running %s after SIGTERM; killed", pid, dockerStopTimeout))
			_ = syscall.Kill(pid, syscall.SIGKILL)
			select {
			case <-d.done:
			case <-time.After(10 * time.Second):
				errs = append(errs, fmt.Errorf("dockerd (pid %d) not reaped 10s after SIGKILL", pid))
			}
		}
	}
	// containerd (managed by dockerd, under our exec root) and the shims
	// (whose -address is that containerd's socket, or whose namespace is
	// ours) must be gone with it; anything left is killed and reported.
	deadline := time.Now().Add(15 * time.Second)
	for {
		left, _ := scanProcs(func(p Proc) bool { return p.contains(d.Dir+"/") || p.contains(d.ns) })
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p.PID, syscall.SIGKILL)
				errs = append(errs, fmt.Errorf("process %d (%s) of the engine outlived dockerd; killed",
					p.PID, strings.Join(p.Argv, " ")))
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := unmountBelow(d.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// buildImage imports the test image unless the engine already has it.
func (d *Docker) buildImage(lockBin, workload string) error {
	busybox := os.Getenv(EnvBusybox)
	if busybox == "" {
		busybox = "/bin/busybox"
	}
	for _, bin := range []struct{ path, fix string }{
		{busybox, "apt-get install -y busybox-static (or set " + EnvBusybox + ")"},
		{lockBin, "build it with `make lock` (CGO_ENABLED=0)"},
		{workload, "BuildTestWorkload builds it with CGO_ENABLED=0"},
	} {
		if err := requireStatic(bin.path); err != nil {
			return fmt.Errorf("%v: the test image needs a static binary: %s", err, bin.fix)
		}
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %v: %s", busybox, err, dockerFix)
	}
	var tarball bytes.Buffer
	if err := writeImageTar(&tarball, busybox, strings.Fields(string(applets)), lockBin, workload); err != nil {
		return err
	}
	sum := sha256.Sum256(tarball.Bytes())
	d.Image = ImageRepository + ":" + hex.EncodeToString(sum[:])[:16]
	if _, err := d.TryCLI("image", "inspect", d.Image); err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cli, "-H", d.Endpoint, "import",
		"--change", "ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"--change", `CMD ["/bin/sh"]`, "-", d.Image)
	cmd.Env = append(filterEnv(os.Environ(), "DOCKER_"), "DOCKER_CONFIG="+filepath.Join(d.Dir, "cli"))
	cmd.Stdin = &tarball
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("docker import %s: %v: %s", d.Image, err, out)
	}
	return nil
}

// requireStatic fails unless path is an ELF executable without an
// interpreter (statically linked).
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

// writeImageTar writes the test image's root filesystem as a tar stream
// with fixed times and owners, so that equal inputs give an equal hash.
func writeImageTar(w io.Writer, busybox string, applets []string, lockBin, workload string) error {
	tw := tar.NewWriter(w)
	mtime := time.Unix(0, 0)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mtime})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	copyFile := func(name, src string) error {
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return file(name, 0o755, data)
	}
	for _, dd := range []struct {
		name string
		mode int64
	}{{"bin", 0o755}, {"sbin", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"usr/local", 0o755}, {"usr/local/bin", 0o755}, {"etc", 0o755}, {"root", 0o700},
		{"tmp", 0o1777}, {"var", 0o755}, {"var/tmp", 0o1777}, {"run", 0o755},
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}} {
		if err := dir(dd.name, dd.mode); err != nil {
			return err
		}
	}
	if err := copyFile("bin/busybox", busybox); err != nil {
		return err
	}
	for _, a := range applets {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
			return err
		}
	}
	if err := copyFile(strings.TrimPrefix(ImageLockPath, "/"), lockBin); err != nil {
		return err
	}
	if err := copyFile(strings.TrimPrefix(ImageWorkloadPath, "/"), workload); err != nil {
		return err
	}
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")); err != nil {
		return err
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")); err != nil {
		return err
	}
	return tw.Close()
}
