package driver

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// The operator's release token. `nomad job stop -purge` removes the
// allocation from the servers at once, and with it the task's workload
// identity: under ACLs neither the supervisor nor the plugin can release
// with it any more, and the next holder would wait for the server's expiry
// (2×TTL + delay). The operator may give the plugin a token of its own
// (plugin config release_token_file) to release such a lock with its lock
// ID, once the plugin has proven every process of the task dead. The token
// only releases a lock this plugin's supervisor holds: a release needs the
// lock ID, which only the holder has.
//
// The token goes only to the Nomad agent: through the task's api.sock (the
// Task API takes ACL tokens as well as workload identities), on a
// connection whose server runs as root and is the very process that
// started the plugin (the plugin's parent, with the executable it had at
// start), so that a socket a task user put in place of api.sock never sees
// it: not even one of Nomad's own helpers run from the agent's binary.

// readReleaseToken reads the operator's token file. It must be a regular
// file owned by root that nobody else may read or write: it holds a secret,
// and a task user must not be able to swap it.
func readReleaseToken(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("plugin config release_token_file %q: not an absolute path", path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("plugin config release_token_file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("plugin config release_token_file: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("plugin config release_token_file %s: not a regular file", path)
	case st == nil || st.Uid != 0 || fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("plugin config release_token_file %s: must be owned by root with mode 0600 "+
			"(it is %04o): run `chown root:root %s && chmod 0600 %s`", path, fi.Mode().Perm(), path, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("plugin config release_token_file %s: %w", path, err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" || len(b) > maxTokenFile {
		return "", fmt.Errorf("plugin config release_token_file %s: want one ACL token (a secret ID)", path)
	}
	return token, nil
}

const maxTokenFile = 4 << 10

// exeID names a process's program by the device and inode of its
// executable, as /proc/<pid>/exe shows them.
type exeID struct{ dev, ino uint64 }

func exeOf(pid int) (exeID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid)+"/exe", &st); err != nil {
		return exeID{}, err
	}
	return exeID{uint64(st.Dev), st.Ino}, nil
}

// agentExe is the program of the plugin's parent: the Nomad agent, which
// starts driver plugins. Zero when the parent is gone (the plugin was
// re-parented): the token is then sent to nobody.
func agentExe() exeID {
	ppid := os.Getppid()
	if ppid <= 1 {
		return exeID{}
	}
	id, err := exeOf(ppid)
	if err != nil {
		return exeID{}
	}
	return id
}

// errNoReleaseToken says what to configure so that the plugin can release
// for a task whose identity no longer authenticates.
var errNoReleaseToken = errors.New("the plugin config sets no release_token_file: set it to a root-owned 0600 file " +
	"holding an ACL token with `write` and `read` on the lock's variable path (examples/acl/singleton-release.policy.hcl) " +
	"so that the plugin can release for purged jobs, or stop jobs before you purge them")

// operatorEndpoint is the task's api.sock with the operator's token, for a
// release the task's own identity can no longer make.
func (d *Driver) operatorEndpoint(h *taskHandle) (lockclient.Endpoint, error) {
	return d.operatorEndpointAt(h.cfg.TaskDir().SecretsDir)
}

// operatorEndpointAt is operatorEndpoint through the Task API socket in
// secretsDir, a task's secrets dir.
func (d *Driver) operatorEndpointAt(secretsDir string) (lockclient.Endpoint, error) {
	d.mu.RLock()
	path, agent := d.config.ReleaseTokenFile, d.agent
	d.mu.RUnlock()
	if path == "" {
		return lockclient.Endpoint{}, errNoReleaseToken
	}
	if agent == (exeID{}) {
		return lockclient.Endpoint{}, errors.New("the plugin cannot tell the Nomad agent's process (its parent is gone), " +
			"so it sends the release_token_file's token to nobody")
	}
	token, err := readReleaseToken(path)
	if err != nil {
		return lockclient.Endpoint{}, err
	}
	return lockclient.Endpoint{
		Address: "unix://" + filepath.Join(secretsDir, "api.sock"), Token: token,
		TaskAPI: true, RootPeer: true,
		Peer: agentPeer(agent),
	}, nil
}

// agentPeer accepts as the socket's server only the plugin's parent, the
// agent that started it, while it still runs the executable it ran then.
// The executable alone is not enough: Nomad's own root helpers (logmon,
// executor) run from the agent's binary and serve sockets a task user can
// point api.sock at.
func agentPeer(agent exeID) func(pid int32) error {
	return func(pid int32) error {
		if ppid := os.Getppid(); int(pid) != ppid || ppid <= 1 {
			return fmt.Errorf("the socket's server (pid %d) is not the Nomad agent that started the plugin (pid %d): not sending it the release token", pid, ppid)
		}
		if id, err := exeOf(int(pid)); err != nil || id != agent {
			return fmt.Errorf("the socket's server (pid %d) no longer runs the Nomad agent's executable: not sending it the release token", pid)
		}
		return nil
	}
}
