// Package lockclient holds a lease on a Nomad Variable lock: it finds the Task
// API socket and token, acquires (waiting on a blocking query while another
// holder has it), renews, fences itself by a local deadline, releases, and
// reads holder information.
//
// Timeline of one lease (t0 = when the last successful renew was sent):
//
//	t0 + RenewInterval        next renew is sent
//	t0 + TTL - FenceMargin    fence deadline: Lost() fires if no renew succeeded
//	t0 + 2*TTL                earliest moment the server expires the lock
//	... + LockDelay           earliest moment another holder can acquire
//
// A 409 or 404 on renew fires Lost() at once. Because the server waits 2*TTL +
// LockDelay and we give up at TTL - FenceMargin, a holder whose process stops
// short of that still has a full TTL to stop its workload before anyone else
// can hold the lock.
//
// The whole argument for "never two at once" (deadlines, partitions, proving
// every process dead before a release, what the driver and its tasks add) is
// in docs/design.md.
package lockclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
)

// Limits Nomad enforces on lock TTLs (nomad/structs/variables.go).
const (
	MinTTL = 10 * time.Second
	MaxTTL = 24 * time.Hour
)

// Timing holds every duration the lease uses. Zero values take the defaults
// described on each field.
type Timing struct {
	// TTL is the lease the server grants; it expires the lock 2*TTL after the
	// last renew. 10s to 24h.
	TTL time.Duration
	// LockDelay is how long the server keeps an expired lock from a new holder.
	// It must be > 0: Nomad silently turns 0 into 15s.
	LockDelay time.Duration
	// RenewInterval is the time between renews. Default TTL/2.
	RenewInterval time.Duration
	// FenceMargin is taken off the TTL to get the fence deadline, for clock-rate
	// error and scheduling delay. Default TTL/10, at least 500ms.
	FenceMargin time.Duration
	// RequestTimeout bounds every non-blocking HTTP call. Default TTL/4, at most 10s.
	RequestTimeout time.Duration
	// BlockingWait is the wait of one blocking query on a held lock. Default 30s.
	BlockingWait time.Duration
	// MaxBackoff caps the jittered exponential backoff after API errors. Default 5s.
	MaxBackoff time.Duration
}

// WithDefaults is t with its zero values replaced by their defaults.
func (t Timing) WithDefaults() Timing { return t.withDefaults() }

func (t Timing) withDefaults() Timing {
	if t.RenewInterval == 0 {
		t.RenewInterval = t.TTL / 2
	}
	if t.FenceMargin == 0 {
		t.FenceMargin = max(t.TTL/10, 500*time.Millisecond)
	}
	if t.RequestTimeout == 0 {
		t.RequestTimeout = min(t.TTL/4, 10*time.Second)
	}
	if t.BlockingWait == 0 {
		t.BlockingWait = 30 * time.Second
	}
	if t.MaxBackoff == 0 {
		t.MaxBackoff = 5 * time.Second
	}
	return t
}

// Validate checks the timings against Nomad's limits and each other.
func (t Timing) Validate() error {
	switch {
	case t.TTL < MinTTL || t.TTL > MaxTTL:
		return configErrorf("lock TTL %s is out of range: Nomad accepts 10s to 24h", t.TTL)
	case t.LockDelay <= 0:
		return configErrorf("lock delay %s must be greater than 0: Nomad replaces 0 with 15s; use e.g. 1s", t.LockDelay)
	}
	t = t.withDefaults()
	fence := t.TTL - t.FenceMargin
	switch {
	case t.FenceMargin < 0 || t.FenceMargin >= t.TTL/2:
		return configErrorf("fence margin %s must be between 0 and TTL/2 (%s)", t.FenceMargin, t.TTL/2)
	case t.RenewInterval <= 0 || t.RenewInterval >= fence:
		return configErrorf("renew interval %s must be greater than 0 and below TTL - fence margin (%s); the default is TTL/2",
			t.RenewInterval, fence)
	case t.RequestTimeout <= 0 || t.RequestTimeout > fence-t.RenewInterval:
		return configErrorf("request timeout %s must leave room for a renew before the fence deadline (at most %s)",
			t.RequestTimeout, fence-t.RenewInterval)
	case t.MaxBackoff <= 0 || t.BlockingWait <= 0:
		return configErrorf("backoff and blocking wait must be positive")
	}
	return nil
}

// Config is everything a Locker needs.
type Config struct {
	Endpoint  Endpoint
	Namespace string // "" means the token's default namespace
	Path      string
	Timing
	// Holder is written into the variable on acquire. AcquiredAt, TTL and
	// LockDelay are filled in by Acquire.
	Holder Holder
	// Holders, if above 0, makes Path the prefix of a semaphore of that
	// many slots: Acquire takes one of the locks SlotPath(Path, 0) …
	// SlotPath(Path, Holders-1), and at most Holders leases exist at once
	// (semaphore.go). 0 is one lock at Path.
	Holders int
	// PreferSlot is the holder's allocation index: a semaphore tries slot
	// PreferSlot mod Holders first, so a replacement usually takes over
	// the same slot.
	PreferSlot int
	// Heartbeat, if set, is lease mode (heartbeat.go, docs/lease.md): the
	// lock plus a heartbeat, a self-fence on it, and the lock ID escrowed
	// for a standby's takeover of a dead holder.
	Heartbeat *Heartbeat
	// MaxRetry ends Acquire after this many consecutive API errors (not
	// conflicts). 0 retries until the wait ends.
	MaxRetry int
	Logger   hclog.Logger
}

// Locker acquires leases on one variable path.
type Locker struct {
	cfg   Config
	api   *api.Client // for what is not the lease's: the token's own ACL
	vars  lockAPI     // the variable and its lock
	cas   casAPI      // check-and-set writes (heartbeat, the lock's record); nil without one
	slots []*Locker   // a semaphore's, one per slot (Config.Holders)
	clock clock
	log   hclog.Logger
	// seesOnce and sees cache whether the token is shown lock state.
	seesOnce sync.Once
	sees     bool
	// sawLock is set once a read showed the Lock field: the token sees
	// lock state, so a read without it shows a free lock.
	sawLock atomic.Bool
	// observer hears every lease's renews and losses (SetObserver).
	observer observerBox
}

// New validates cfg and builds the API client. No request is sent.
func New(cfg Config) (*Locker, error) {
	cfg, err := cfg.prepared()
	if err != nil {
		return nil, err
	}
	client, err := cfg.Endpoint.Client(cfg.Namespace)
	if err != nil {
		return nil, err
	}
	return newLocker(cfg, client, client.Variables(), theBootClock), nil
}

// prepared validates cfg and fills in its defaults.
func (cfg Config) prepared() (Config, error) {
	if err := ValidatePath(cfg.Path); err != nil {
		return cfg, err
	}
	if err := cfg.Timing.Validate(); err != nil {
		return cfg, err
	}
	if err := cfg.validateHolders(); err != nil {
		return cfg, err
	}
	if cfg.Heartbeat != nil {
		if cfg.Holders > 0 {
			return cfg, configErrorf("lease mode with holders (a semaphore) is not supported: use a single lock")
		}
		if err := cfg.Heartbeat.Validate(cfg.Timing); err != nil {
			return cfg, err
		}
	}
	cfg.Timing = cfg.Timing.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return cfg, nil
}

// newLocker assembles a Locker from a prepared cfg and its seams.
func newLocker(cfg Config, client *api.Client, vars lockAPI, c clock) *Locker {
	l := &Locker{cfg: cfg, api: client, vars: vars, clock: c, log: cfg.Logger.With("path", cfg.Path)}
	if cas, ok := vars.(casAPI); ok {
		l.cas = cas
	}
	l.slots = l.slotLockers()
	return l
}

// Config returns the effective configuration, defaults filled in.
func (l *Locker) Config() Config { return l.cfg }

// AcquireOptions shape one Acquire call.
type AcquireOptions struct {
	// Wait bounds the whole acquire; 0 waits until ctx ends.
	Wait time.Duration
	// TryOnce returns ErrNotAcquired at the first conflict.
	TryOnce bool
	// OnBlocked is called when the lock is found held by a different holder
	// than last reported, e.g. to emit "waiting for lock held by ...".
	OnBlocked func(Holder)
	// Items are written into the holder's record beside lockclient's own
	// (which win should a key be the same): claims of the caller's that
	// the next holder reads (Lease.PreviousItem) and that the caller may
	// withdraw (Lease.SetItem).
	Items map[string]string
	// Defer, if set, is asked before each attempt made while the lock
	// looks free (see snapshot.looksFree). hold keeps the caller from
	// acquiring at all for now (an allocation that is being stopped): the
	// loop waits for the variable to change, or the blocking wait to end,
	// and asks again. A positive grace lets another holder take the lock
	// first: the loop waits, for as long as the lock looks free and at
	// most grace counted from when it first saw it free, for the variable
	// to change, and then acquires anyway. previous is the holder record as
	// read (a handover a holder that stepped down left in it).
	Defer func(ctx context.Context, previous Holder) (grace time.Duration, hold bool)
}

// Acquire takes the lock, waiting while another holder has it. While held
// elsewhere it parks on a blocking query of the variable and retries the moment
// the variable changes (release, or expiry after the lock delay). API errors
// are retried with jittered exponential backoff.
func (l *Locker) Acquire(ctx context.Context, opts AcquireOptions) (*Lease, error) {
	if l.cfg.Holders > 0 {
		return l.acquireSlot(ctx, opts)
	}
	if opts.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, l.clock, opts.Wait)
		defer cancel()
	}
	retry := l.newRetrier()
	retryAfter := func(err error) error { return retry.after(ctx, err) }
	var reported Holder
	var deferred deferral

	for {
		if err := ctx.Err(); err != nil {
			return nil, l.waitError(ctx, opts)
		}
		current, index, err := l.read(ctx, 0)
		if err != nil {
			if permanent(err) {
				return nil, err
			}
			if err := retryAfter(err); err != nil {
				return nil, l.waitError(ctx, opts, err)
			}
			continue
		}

		if l.deferAttempt(ctx, current, index, opts, &deferred) {
			continue
		}
		var lease *Lease
		if opts.Defer != nil && current.heldVisibly() {
			// Held, as we are shown: wait for a change and read again,
			// rather than race a release that would then go unseen by
			// Defer.
			err = ErrNotAcquired
		} else {
			lease, err = l.tryAcquire(ctx, current, opts)
		}
		switch {
		case err == nil:
			return lease, nil
		case errors.Is(err, ErrNotAcquired):
			deferred = deferral{}
			retry.reset()
			holder := holderFromItems(current.items())
			if holder != reported {
				reported = holder
				l.log.Info("lock is held, waiting", "holder", holder.String())
				if opts.OnBlocked != nil {
					opts.OnBlocked(holder)
				}
			}
			if opts.TryOnce {
				return nil, fmt.Errorf("acquire %s: %w (%s)", l.cfg.Path, ErrNotAcquired, holder)
			}
			if _, _, err := l.read(ctx, index); err != nil && !permanent(err) && ctx.Err() == nil {
				if err := retryAfter(err); err != nil {
					return nil, l.waitError(ctx, opts, err)
				}
			}
		case permanent(err):
			return nil, err
		default:
			if err := retryAfter(err); err != nil {
				return nil, l.waitError(ctx, opts, err)
			}
		}
	}
}

// deferAttempt asks opts.Defer, while the lock looks free, whether to
// give way, and if so waits (a blocking read of the variable at index,
// bounded by what is left of the grace, or a whole blocking wait to hold).
// It reports whether it waited, in which case the loop reads again.
func (l *Locker) deferAttempt(ctx context.Context, current snapshot, index uint64, opts AcquireOptions, d *deferral) bool {
	if opts.Defer == nil || !l.looksFree(ctx, current) {
		*d = deferral{}
		return false
	}
	grace, hold := opts.Defer(ctx, holderFromItems(current.items()))
	now := l.clock.Now().UnixNano()
	var left time.Duration
	switch {
	case hold:
		*d = deferral{}
		left = l.cfg.BlockingWait
	case grace <= 0:
		*d = deferral{}
		return false
	default:
		if d.since == 0 {
			d.since, d.until = now, now+int64(grace)
			l.log.Info("lock is free: giving way to another standby first", "grace", grace)
		}
		if left = time.Duration(d.until - now); left <= 0 {
			l.log.Info("lock still free after the grace: acquiring", "grace", grace)
			return false
		}
	}
	wctx, cancel := withTimeout(ctx, l.clock, left)
	defer cancel()
	if index == 0 {
		_ = sleep(wctx, l.clock, min(left, time.Second))
		return true
	}
	_, _, _ = l.read(wctx, index)
	return true
}

// waitError turns the end of the acquire loop into the error callers expect.
func (l *Locker) waitError(ctx context.Context, opts AcquireOptions, cause ...error) error {
	if len(cause) > 0 && !errors.Is(cause[0], context.DeadlineExceeded) && !errors.Is(cause[0], context.Canceled) {
		return cause[0]
	}
	if opts.Wait > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("acquire %s: %w (%s)", l.cfg.Path, ErrWaitTimeout, opts.Wait)
	}
	return fmt.Errorf("acquire %s: %w", l.cfg.Path, context.Cause(ctx))
}

// snapshot is what a plain read of the variable told us.
type snapshot struct{ v *api.Variable }

func (s snapshot) items() map[string]string {
	if s.v == nil {
		return nil
	}
	return s.v.Items
}

// read GETs the variable. With index > 0 it is a blocking query that returns
// when the variable's ModifyIndex passes index, or after BlockingWait. It
// returns the index to block on next.
func (l *Locker) read(ctx context.Context, index uint64) (snapshot, uint64, error) {
	timeout := l.cfg.RequestTimeout
	q := &api.QueryOptions{}
	if index > 0 {
		q.WaitIndex = index
		q.WaitTime = l.cfg.BlockingWait
		// Nomad adds up to wait/16 of jitter to a blocking query.
		timeout += l.cfg.BlockingWait + l.cfg.BlockingWait/16
	}
	rctx, cancel := withTimeout(ctx, l.clock, timeout)
	defer cancel()
	v, meta, err := l.vars.Peek(l.cfg.Path, q.WithContext(rctx))
	if err != nil {
		return snapshot{}, 0, l.classify("read", err)
	}
	if meta == nil {
		return snapshot{v}, 0, nil
	}
	return snapshot{v}, meta.LastIndex, nil
}

// tryAcquire sends one lock-acquire. current is the variable as read just
// before, which names the previous holder.
func (l *Locker) tryAcquire(ctx context.Context, current snapshot, opts AcquireOptions) (*Lease, error) {
	holder := l.cfg.Holder
	holder.PreviousUpstream = holderFromItems(current.items()).Upstream
	holder.AcquiredAt = time.Now() // the wall clock: read by people and other hosts, never a deadline
	holder.TTL = l.cfg.TTL
	holder.LockDelay = l.cfg.LockDelay
	items := holder.items()
	for k, v := range opts.Items {
		if _, own := items[k]; !own {
			items[k] = v
		}
	}
	v := &api.Variable{
		Namespace: l.cfg.Namespace,
		Path:      l.cfg.Path,
		Items:     items,
		Lock: &api.VariableLock{
			TTL:       l.cfg.TTL.String(),
			LockDelay: l.cfg.LockDelay.String(),
		},
	}
	sent := l.clock.Now()
	rctx, cancel := withTimeout(ctx, l.clock, l.cfg.RequestTimeout)
	defer cancel()
	out, _, err := l.vars.AcquireLock(v, l.writeOptions(rctx))
	if err != nil {
		if statusCode(err) == http.StatusConflict {
			return nil, ErrNotAcquired
		}
		return nil, l.classify("acquire", err)
	}
	if out == nil || out.Lock == nil || out.Lock.ID == "" {
		return nil, fmt.Errorf("acquire %s: Nomad answered without a lock ID", l.cfg.Path)
	}
	lease := newLease(l, out.Lock.ID, out.ModifyIndex, sent, holderFromItems(current.items()))
	lease.previousItems = current.items()
	l.log.Info("lock acquired", "fence", lease.Fence)
	if l.cfg.Heartbeat != nil {
		if err := lease.startHeartbeat(ctx); err != nil {
			l.log.Error("lease mode: cannot escrow the lock or write the first heartbeat; releasing", "error", err)
			rctx, cancel := withTimeout(context.Background(), l.clock, l.cfg.RequestTimeout+time.Second)
			_ = lease.Release(rctx)
			cancel()
			return nil, err
		}
		close(lease.beating)
	}
	return lease, nil
}

func (l *Locker) writeOptions(ctx context.Context) *api.WriteOptions {
	return (&api.WriteOptions{Namespace: l.cfg.Namespace}).WithContext(ctx)
}

// retrier is an acquire loop's answer to lock API errors: a backoff, and
// ErrTooManyErrors after MaxRetry failures in a row.
type retrier struct {
	l        *Locker
	bo       backoff.BackOff
	failures int
}

func (l *Locker) newRetrier() *retrier { return &retrier{l: l, bo: l.newBackoff()} }

// after counts err and sleeps the next backoff; it returns an error when
// the loop must end (too many failures, or ctx done).
func (r *retrier) after(ctx context.Context, err error) error {
	r.failures++
	if r.l.cfg.MaxRetry > 0 && r.failures >= r.l.cfg.MaxRetry {
		return fmt.Errorf("%w (%d): %w", ErrTooManyErrors, r.failures, err)
	}
	d := r.bo.NextBackOff()
	r.l.log.Warn("lock API error, retrying", "error", err, "backoff", d)
	return sleep(ctx, r.l.clock, d)
}

// reset starts the count and the backoff again after a success.
func (r *retrier) reset() {
	r.failures = 0
	r.bo.Reset()
}

func (l *Locker) newBackoff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = l.cfg.MaxBackoff
	b.RandomizationFactor = 0.5
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}
