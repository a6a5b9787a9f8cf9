package locktest

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/testkey"
)

// Vars is an in-memory lock API for many variables: one Server per path,
// made at its first use, so that each slot of a semaphore
// (lockclient.Config.Holders) is its own lock with its own index, as on
// Nomad. It is safe for concurrent use.
type Vars struct {
	mu      sync.Mutex
	servers map[string]*Server
}

// NewVars returns a Vars with no variable.
func NewVars() *Vars { return &Vars{servers: map[string]*Server{}} }

// Server is the Server of path: what the test controls of that variable.
func (vs *Vars) Server(path string) *Server {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	s, ok := vs.servers[path]
	if !ok {
		s = New()
		vs.servers[path] = s
	}
	return s
}

// Locker builds a Locker over vs with cfg (see lockclient.NewWithLockAPI);
// an invalid cfg fails the test.
func (vs *Vars) Locker(t testing.TB, cfg lockclient.Config) *lockclient.Locker {
	t.Helper()
	l, err := lockclient.NewWithLockAPI(testkey.Get(), cfg, vs)
	if err != nil {
		t.Fatalf("locktest: %v", err)
	}
	return l
}

// Calls is how many requests of op were made, over every variable.
func (vs *Vars) Calls(op string) int {
	vs.mu.Lock()
	servers := make([]*Server, 0, len(vs.servers))
	for _, s := range vs.servers {
		servers = append(servers, s)
	}
	vs.mu.Unlock()
	n := 0
	for _, s := range servers {
		n += s.Calls(op)
	}
	return n
}

// Peek is Server.Peek on path's Server.
func (vs *Vars) Peek(path string, q *api.QueryOptions) (*api.Variable, *api.QueryMeta, error) {
	return vs.Server(path).Peek(path, q)
}

// AcquireLock is Server.AcquireLock on v.Path's Server.
func (vs *Vars) AcquireLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	return vs.Server(v.Path).AcquireLock(v, w)
}

// RenewLock is Server.RenewLock on v.Path's Server.
func (vs *Vars) RenewLock(v *api.Variable, w *api.WriteOptions) (*api.VariableMetadata, *api.WriteMeta, error) {
	return vs.Server(v.Path).RenewLock(v, w)
}

// ReleaseLock is Server.ReleaseLock on v.Path's Server.
func (vs *Vars) ReleaseLock(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	return vs.Server(v.Path).ReleaseLock(v, w)
}

// CheckedCreate is Server.CheckedCreate on v.Path's Server.
func (vs *Vars) CheckedCreate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	return vs.Server(v.Path).CheckedCreate(v, w)
}

// Update is Server.Update on v.Path's Server.
func (vs *Vars) Update(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	return vs.Server(v.Path).Update(v, w)
}

// CheckedUpdate is Server.CheckedUpdate on v.Path's Server.
func (vs *Vars) CheckedUpdate(v *api.Variable, w *api.WriteOptions) (*api.Variable, *api.WriteMeta, error) {
	return vs.Server(v.Path).CheckedUpdate(v, w)
}

// Delete is Server.Delete on path's Server.
func (vs *Vars) Delete(path string, w *api.WriteOptions) (*api.WriteMeta, error) {
	return vs.Server(path).Delete(path, w)
}

// PrefixList lists the variables under prefix that exist, as Nomad's list
// answers a token that may read them all.
func (vs *Vars) PrefixList(prefix string, q *api.QueryOptions) ([]*api.VariableMetadata, *api.QueryMeta, error) {
	vs.mu.Lock()
	paths := make([]string, 0, len(vs.servers))
	for p := range vs.servers {
		if strings.HasPrefix(p, prefix) {
			paths = append(paths, p)
		}
	}
	vs.mu.Unlock()
	slices.Sort(paths)
	var out []*api.VariableMetadata
	for _, p := range paths {
		v, _, err := vs.Server(p).Peek(p, &api.QueryOptions{})
		if err != nil {
			return nil, nil, err
		}
		if v != nil {
			out = append(out, &api.VariableMetadata{Namespace: v.Namespace, Path: p, ModifyIndex: v.ModifyIndex})
		}
	}
	return out, &api.QueryMeta{}, nil
}
