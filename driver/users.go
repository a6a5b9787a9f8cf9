package driver

import (
	"fmt"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/hashicorp/nomad/drivers/shared/validators"
	"golang.org/x/sys/unix"
)

// userPolicy is the plugin config's say on who a task may run as. A job
// submitter chooses `user`; the operator decides what that may map to.
type userPolicy struct {
	defaultUser string
	allowRoot   bool
	deniedUIDs  *validators.Validator
}

// taskIdentity is a resolved task user.
type taskIdentity struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
}

// resolve maps a task's `user` (or the plugin's default_user) to IDs and
// refuses what the plugin config does not allow. Every refusal names the
// option that decides it.
func (p userPolicy) resolve(taskUser string) (taskIdentity, error) {
	name := taskUser
	if name == "" {
		name = p.defaultUser
	}
	u, err := user.Lookup(name)
	if err != nil {
		if taskUser == "" {
			return taskIdentity{}, fmt.Errorf("plugin config default_user %q: %w: set default_user to a user that exists on this client", name, err)
		}
		return taskIdentity{}, fmt.Errorf("task user %q: %w: set the task's `user` to a user that exists on this client", name, err)
	}
	id := taskIdentity{name: name}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return id, fmt.Errorf("task user %q has a non-numeric uid or gid (%s:%s)", name, u.Uid, u.Gid)
	}
	id.uid, id.gid = uint32(uid), uint32(gid)
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				id.groups = append(id.groups, uint32(n))
			}
		}
	}
	if id.uid == 0 && !p.allowRoot {
		how := "set `user` in the task to an unprivileged user"
		if taskUser == "" {
			how = "set `user` in the task, or the plugin config default_user, to an unprivileged user"
		}
		return id, fmt.Errorf("task would run as root (user %q), which the singleton plugin refuses by default: %s; "+
			"or, only if everyone who may submit jobs may have root on this client, set allow_root = true in the plugin config", name, how)
	}
	if p.deniedUIDs != nil {
		if err := p.deniedUIDs.HasValidIDs(name); err != nil {
			return id, fmt.Errorf("task user %q is not allowed on this client (plugin config denied_host_uids/denied_host_gids): %w", name, err)
		}
	}
	return id, nil
}

// checkReach fails, with the fix, when the task user cannot search every
// directory down to its task dir: the workload would otherwise die at start
// with a bare exit code 126.
func checkReach(dir string, id taskIdentity) error {
	if id.uid == 0 {
		return nil
	}
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("task dir %s: %w", dir, err)
		}
		var bit uint32 = unix.S_IXOTH
		switch {
		case st.Uid == id.uid:
			bit = unix.S_IXUSR
		case st.Gid == id.gid || slices.Contains(id.groups, st.Gid):
			bit = unix.S_IXGRP
		}
		if st.Mode&bit == 0 {
			return fmt.Errorf("task user %q (uid %d) cannot reach its task dir %s: %s is mode %04o, owned by uid %d: "+
				"make the client's data_dir searchable by the task user (for example chmod 0711 %s), or run the task as a user that can reach it",
				id.name, id.uid, dir, p, st.Mode&0o7777, st.Uid, p)
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}
