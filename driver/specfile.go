package driver

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// A task's spec.json outlives the plugin that wrote it: after an upgrade,
// the new plugin recovers the tasks the old one started (their supervisors,
// of the old build, run on), and reads their specs to watch them, stand by
// for them, kill their gated tasks or release for them. So every version
// of it is read (readSpec): this one (shim.SpecVersion, in Run.Version),
// and version 1, written by the plugins before the version was recorded
// (legacySpec). One of a later version, whose fields this plugin cannot
// know, is refused with an error that names the way out, never read as
// something else.

// legacySpecVersion is the version of the specs that record none: Run is
// missing, and the lock settings are fields of the spec itself.
const legacySpecVersion = 1

// readSpec reads the spec.json of dir into *spec, of any version this
// plugin knows.
func readSpec(dir *securefs.Dir, spec *supervisorSpec) error {
	b, err := dir.ReadFile(specFile, maxFileSize)
	if err != nil {
		return err
	}
	got, err := decodeSpec(b)
	if err == nil {
		*spec = got
	}
	return err
}

// decodeSpec decodes a spec.json of any version this plugin knows.
func decodeSpec(b []byte) (supervisorSpec, error) {
	var probe struct{ Run *struct{ Version int } }
	if err := json.Unmarshal(b, &probe); err != nil {
		return supervisorSpec{}, fmt.Errorf("decode %s: %w", specFile, err)
	}
	version := legacySpecVersion
	if probe.Run != nil {
		version = probe.Run.Version
	}
	if err := checkSpecVersion(version); err != nil {
		return supervisorSpec{}, err
	}
	if version == legacySpecVersion {
		return decodeLegacySpec(b)
	}
	var spec supervisorSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return supervisorSpec{}, fmt.Errorf("decode %s: %w", specFile, err)
	}
	return spec, nil
}

// checkSpecVersion refuses a spec of a version this plugin does not know.
func checkSpecVersion(version int) error {
	if version == legacySpecVersion || version == shim.SpecVersion {
		return nil
	}
	return fmt.Errorf("the task's state is of version %d, and this plugin (%s) reads versions %d to %d: "+
		"a newer plugin started the task; install that plugin version (or a later one) on this client again to "+
		"supervise it, or stop the allocation", version, shim.Version, legacySpecVersion, shim.SpecVersion)
}

// legacySpec is spec.json as version 1 wrote it. Its lock settings bear
// the names of the run config's fields, and its holder that of the run's, so
// the embedded run takes them as they are; the few fields that differ are
// read beside it. What a setting left out defaults to is the older
// supervisor's business: the plugin reads the lock, its timing and its
// mode, which that version always wrote.
type legacySpec struct {
	shim.Spec
	// LB is the task's load_balancer block as written (the old supervisor
	// resolved its port labels itself): the plugin reads its deadlines. It
	// shadows the run's LB; Gate, the run's Gate.
	LB struct {
		URI, RemoveDeadline, RequestTimeout string
	}
	KillSigSet  bool
	SecretsDir  string
	StartOnLock bool
	TaskID      string
	Gate        *struct {
		AllocID, Task, Namespace string
		Adopt                    *shim.AdoptLease
		DockerEndpoint           string
	}
	taskProcess
}

// decodeLegacySpec reads a version 1 spec.json as this version's spec.
func decodeLegacySpec(b []byte) (supervisorSpec, error) {
	var old legacySpec
	if err := json.Unmarshal(b, &old); err != nil {
		return supervisorSpec{}, fmt.Errorf("decode %s (version %d): %w", specFile, legacySpecVersion, err)
	}
	run := old.Spec
	run.Version, run.LB = legacySpecVersion, nil
	run.KillSignalSet, run.RootSecretsDir = old.KillSigSet, old.SecretsDir
	spec := supervisorSpec{Run: run, TaskID: old.TaskID, taskProcess: old.taskProcess}
	if old.LB.URI != "" {
		spec.legacyLBReserve = legacyLBReserve(old.LB.RemoveDeadline, old.LB.RequestTimeout)
	}
	switch g := old.Gate; {
	case g != nil:
		spec.Run.Gate = &shim.GateSpec{AllocID: g.AllocID, Task: g.Task, Namespace: g.Namespace, Adopt: g.Adopt}
		spec.DockerEndpoint = g.DockerEndpoint
	case old.StartOnLock:
		spec.Run.WatchAlloc = &shim.AllocWatch{AllocID: old.Holder.AllocID, Namespace: old.Namespace, Who: onLockWho}
	}
	return spec, nil
}

// legacyLBReserve is lbRemoveReserve for a version 1 task's
// load_balancer block: its remove_deadline and request_timeout as written,
// or their defaults.
func legacyLBReserve(removeDeadline, requestTimeout string) time.Duration {
	parse := func(v string, def time.Duration) time.Duration {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
		return def
	}
	return parse(removeDeadline, lbhook.DefaultRemoveDeadline) + parse(requestTimeout, lbhook.DefaultRequestTimeout)
}
