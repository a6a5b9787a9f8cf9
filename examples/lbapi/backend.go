package lbapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// This file connects a real load balancer (a Backend, e.g. HAProxy) to the
// request worker. The Backend acts as the one agent of the groups it serves:
// an APPLY changes what it serves and is answered only once the load balancer
// reports the change; a REVERT or CANCEL undoes what the APPLY changed. Calls
// to the Backend run on one goroutine (agent.run), in the order the worker
// sent them and never under Server.mu, so that a slow load balancer delays
// only the requests of its services.

// Target is one upstream as a load balancer serves it: the (upstream, group)
// pair that identifies an UpstreamInfo.
type Target struct {
	// Upstream is host:port.
	Upstream string
	// Group is the UpstreamInfo group ("default" unless the request named
	// one). Serving reports servers it cannot map to a wanted upstream with
	// an empty Group.
	Group string
}

func (t Target) String() string {
	if t.Group == defaultGroup {
		return t.Upstream
	}
	return t.Upstream + " (group " + t.Group + ")"
}

// Backend is a real load balancer behind the API. Its methods are called
// from one goroutine at a time.
type Backend interface {
	// Name names the load balancer in agent responses (their "url").
	Name() string
	// Sync makes the load balancer serve exactly want for the service and
	// returns nil only once it reads that back from the load balancer.
	Sync(ctx context.Context, serviceID string, want []Target) error
	// Serving returns what the load balancer serves for the service now.
	// A server it cannot map to an upstream it was asked for (added by
	// someone else, or not taking traffic) comes back with an empty Group,
	// so that it never matches a wanted upstream.
	Serving(ctx context.Context, serviceID string) ([]Target, error)
}

const (
	// DefaultReconcileInterval is how often the backend's state is compared
	// with what the API wants, and repaired.
	DefaultReconcileInterval = time.Second
	// backendTimeout bounds one APPLY, REVERT, reconcile or /state read
	// against the backend.
	backendTimeout = 10 * time.Second
)

// change is what one APPLY did to a service's targets, to undo it.
type change struct {
	added, removed []Target
}

// agent runs every Backend call.
type agent struct {
	b        Backend
	log      hclog.Logger
	groups   map[string]bool
	interval time.Duration

	mu      sync.Mutex
	queue   []func(context.Context)
	wake    chan struct{}
	stopped chan struct{} // closed when run returns

	// Owned by run's goroutine.
	view    map[string][]Target // serviceID → what the backend must serve
	applied map[string]change   // request id → what its APPLY changed
	lastErr map[string]string   // serviceID → last reconcile error logged
}

func newAgent(b Backend, groups []string, interval time.Duration, log hclog.Logger) *agent {
	ag := &agent{
		b: b, log: log, groups: map[string]bool{}, interval: interval,
		wake: make(chan struct{}, 1), stopped: make(chan struct{}), view: map[string][]Target{}, applied: map[string]change{}, lastErr: map[string]string{},
	}
	for _, g := range groups {
		ag.groups[g] = true
	}
	return ag
}

// serves reports whether the backend is the agent of any of groups.
func (ag *agent) serves(groups []string) bool {
	return slices.ContainsFunc(groups, func(g string) bool { return ag.groups[g] })
}

// enqueue adds a job; it never blocks (the worker calls it under Server.mu).
func (ag *agent) enqueue(job func(context.Context)) {
	ag.mu.Lock()
	ag.queue = append(ag.queue, job)
	ag.mu.Unlock()
	select {
	case ag.wake <- struct{}{}:
	default:
	}
}

func (ag *agent) next() func(context.Context) {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if len(ag.queue) == 0 {
		return nil
	}
	job := ag.queue[0]
	ag.queue = ag.queue[1:]
	return job
}

// run executes jobs in order and reconciles every interval until stop.
func (ag *agent) run(stop <-chan struct{}) {
	defer close(ag.stopped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	var tick <-chan time.Time
	if ag.interval > 0 {
		t := time.NewTicker(ag.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		if job := ag.next(); job != nil {
			jctx, jcancel := context.WithTimeout(ctx, backendTimeout)
			job(jctx)
			jcancel()
			continue
		}
		select {
		case <-stop:
			return
		case <-ag.wake:
		case <-tick:
			jctx, jcancel := context.WithTimeout(ctx, backendTimeout)
			ag.reconcileAll(jctx)
			jcancel()
		}
	}
}

// apply queues an agent request of type typ (APPLY, REVERT or CANCEL) for r;
// done receives the answer on the agent's goroutine.
func (ag *agent) apply(typ string, r request, done func(status int, content string)) {
	ag.enqueue(func(ctx context.Context) {
		svc := r.Service.ServiceID
		before := ag.view[svc]
		var after []Target
		if typ == typeApply {
			after = nextTargets(before, r)
		} else {
			// Undo what this request's APPLY changed, if it got that far;
			// otherwise push the view again, which undoes a partial APPLY.
			after = slices.Clone(before)
			if c, ok := ag.applied[r.ID]; ok {
				after = slices.DeleteFunc(after, func(t Target) bool { return slices.Contains(c.added, t) })
				for _, t := range c.removed {
					if !slices.Contains(after, t) {
						after = append(after, t)
					}
				}
				sortTargets(after)
			}
		}
		if err := ag.b.Sync(ctx, svc, after); err != nil {
			ag.log.Warn("load balancer refused the change", "request_id", r.ID, "type", typ, "service_id", svc, "error", err)
			done(500, err.Error())
			return
		}
		ag.view[svc] = after
		if typ == typeApply {
			ag.applied[r.ID] = change{added: targetsMinus(after, before), removed: targetsMinus(before, after)}
		} else {
			delete(ag.applied, r.ID)
		}
		ag.log.Info("load balancer updated", "request_id", r.ID, "type", typ, "service_id", svc, "serving", fmt.Sprint(after))
		done(200, "")
	})
}

// forget drops what an APPLY changed once its request is final.
func (ag *agent) forget(id string) {
	ag.enqueue(func(context.Context) { delete(ag.applied, id) })
}

// observe returns what the backend serves for the service after
// reconciling it with what the API wants. It waits for the agent's
// goroutine, up to ctx.
func (ag *agent) observe(ctx context.Context, serviceID string) ([]Target, error) {
	type result struct {
		ts  []Target
		err error
	}
	ch := make(chan result, 1)
	ag.enqueue(func(jctx context.Context) {
		if ctx.Err() != nil {
			ch <- result{err: ctx.Err()}
			return
		}
		ts, err := ag.reconcile(jctx, serviceID)
		ch <- result{ts, err}
	})
	select {
	case r := <-ch:
		return r.ts, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("load balancer state: %w", ctx.Err())
	case <-ag.stopped:
		return nil, errors.New("load balancer state: the server is closing")
	}
}

// reconcile compares what the backend serves for a service with the view
// and, if they differ, syncs it; it returns what the backend serves then.
func (ag *agent) reconcile(ctx context.Context, serviceID string) ([]Target, error) {
	want := ag.view[serviceID]
	have, err := ag.b.Serving(ctx, serviceID)
	if err != nil {
		return nil, err
	}
	if sameTargets(have, want) {
		return have, nil
	}
	missing, extra := targetsMinus(want, have), targetsMinus(have, want)
	syncErr := ag.b.Sync(ctx, serviceID, want)
	if syncErr != nil {
		ag.log.Warn("load balancer differs from the API's state and could not be repaired", "service_id", serviceID,
			"missing", fmt.Sprint(missing), "unexpected", fmt.Sprint(extra), "error", syncErr)
	} else {
		ag.log.Info("reconciled the load balancer with the API's state", "service_id", serviceID,
			"added", fmt.Sprint(missing), "removed", fmt.Sprint(extra))
	}
	have, err = ag.b.Serving(ctx, serviceID)
	if err != nil {
		return nil, errors.Join(syncErr, err)
	}
	return have, nil
}

// reconcileAll reconciles every service the backend was asked to serve.
func (ag *agent) reconcileAll(ctx context.Context) {
	svcs := make([]string, 0, len(ag.view))
	for s := range ag.view {
		svcs = append(svcs, s)
	}
	sort.Strings(svcs)
	for _, s := range svcs {
		_, err := ag.reconcile(ctx, s)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != ag.lastErr[s] {
			if err != nil {
				ag.log.Warn("cannot read the load balancer's state", "service_id", s, "error", err)
			} else {
				ag.log.Info("load balancer reachable again", "service_id", s)
			}
			ag.lastErr[s] = msg
		}
	}
}

// nextTargets is what a service serves once request r is applied to cur,
// with the commit's rules (store.updateService): remove then add, matching
// by (upstream, group).
func nextTargets(cur []Target, r request) []Target {
	out := slices.Clone(cur)
	for _, u := range r.Remove {
		out = slices.DeleteFunc(out, func(t Target) bool { return t == targetOf(u) })
	}
	for _, u := range r.Add {
		t := targetOf(u)
		out = append(slices.DeleteFunc(out, func(x Target) bool { return x == t }), t)
	}
	sortTargets(out)
	return out
}

func targetOf(u upstream) Target { return Target{Upstream: u.Upstream, Group: u.Group} }

func sortTargets(ts []Target) {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Upstream != ts[j].Upstream {
			return ts[i].Upstream < ts[j].Upstream
		}
		return ts[i].Group < ts[j].Group
	})
}

// targetsMinus is a − b.
func targetsMinus(a, b []Target) []Target {
	var out []Target
	for _, t := range a {
		if !slices.Contains(b, t) {
			out = append(out, t)
		}
	}
	return out
}

func sameTargets(a, b []Target) bool {
	return len(targetsMinus(a, b)) == 0 && len(targetsMinus(b, a)) == 0
}

// backendURL is the agent URL of the backend for request id, in the format
// of simulated agents' URLs.
func backendURL(b Backend, id string) string {
	return strings.TrimRight(b.Name(), "/") + "/request/" + id
}
