package lockclient

import (
	"errors"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/internal/testkey"
)

// NewWithLockAPI builds a Locker whose leases talk to vars instead of
// Nomad: the seam of package lockclient/locktest, whose in-memory lock API
// lets other packages' tests (the supervisor's) run a real lease with
// controlled answers. Only packages under lockclient/ can get the key, so
// production callers cannot hand a Locker a lock API of their own (and skip
// New's endpoint and transport setup). cfg is validated and completed as New
// does. The Locker has no Nomad client besides vars: what is not the
// lease's (the token's ACL) is not available.
func NewWithLockAPI(key testkey.Key, cfg Config, vars lockAPI) (*Locker, error) {
	if !key.Valid() || vars == nil {
		return nil, errors.New("lockclient.NewWithLockAPI: for lockclient/locktest only")
	}
	cfg, err := cfg.prepared()
	if err != nil {
		return nil, err
	}
	return newLocker(cfg, nil, vars, theBootClock), nil
}
