package driver

import (
	"cmp"
	"fmt"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/drivers/shared/validators"
	"golang.org/x/sys/unix"
)

// userPolicy is the plugin config's say on who a task may run as. A job
// submitter chooses `user`; the operator decides what that may map to.
type userPolicy struct {
	defaultUser string
	allowRoot   bool
	deniedUIDs  *validators.Validator
	deniedGIDs  idRanges
}

// newUserPolicy checks the plugin options that decide who tasks run as.
// Group IDs are checked here rather than by Nomad's validator, which in
// 1.11.2 counts every user as a member of group 0.
func newUserPolicy(log hclog.Logger, pc PluginConfig) (userPolicy, error) {
	uids, err := validators.NewValidator(log, pc.DeniedHostUIDs, "")
	if err != nil {
		return userPolicy{}, fmt.Errorf("plugin config denied_host_uids: %w", err)
	}
	gids, err := parseIDRanges(pc.DeniedHostGIDs)
	if err != nil {
		return userPolicy{}, fmt.Errorf("plugin config denied_host_gids: %w", err)
	}
	return userPolicy{defaultUser: cmp.Or(pc.DefaultUser, DefaultUser), allowRoot: pc.AllowRoot, deniedUIDs: uids, deniedGIDs: gids}, nil
}

// idRanges is a list of ID ranges such as "0-999,65534".
type idRanges [][2]uint64

func parseIDRanges(s string) (idRanges, error) {
	var out idRanges
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
		b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 32)
		if err1 != nil || err2 != nil || a > b {
			return nil, fmt.Errorf("%q is not an ID or a range like \"1000-1999\"", part)
		}
		out = append(out, [2]uint64{a, b})
	}
	return out, nil
}

func (r idRanges) contains(id uint32) bool {
	for _, rg := range r {
		if uint64(id) >= rg[0] && uint64(id) <= rg[1] {
			return true
		}
	}
	return false
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
			return id, fmt.Errorf("task user %q is not allowed on this client (plugin config denied_host_uids): %w", name, err)
		}
	}
	for _, g := range append([]uint32{id.gid}, id.groups...) {
		if p.deniedGIDs.contains(g) {
			return id, fmt.Errorf("task user %q is not allowed on this client: it is in group %d, which the plugin config denied_host_gids refuses", name, g)
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
