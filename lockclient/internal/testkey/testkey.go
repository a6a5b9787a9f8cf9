// Package testkey lets lockclient/locktest, and no package outside
// lockclient, build a Locker over a lock API of its own
// (lockclient.NewWithLockAPI). Go lets only packages under lockclient/
// import an internal package, so only they can get a Key; no other package
// can name its type or build one.
package testkey

// Key is what lockclient.NewWithLockAPI asks for.
type Key struct{ valid bool }

// Get returns a valid Key.
func Get() Key { return Key{valid: true} }

// Valid reports whether k came from Get, not from a zero value.
func (k Key) Valid() bool { return k.valid }
