package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The help around the flags; the flags themselves are printed from the
// FlagSet (printFlags), so that the help lists exactly the flags there are.
const (
	runHelpHead = `Usage:
  lock [flags] <path> <command> [args...]   run command while holding the lock at <path>
  lock status [flags] <path>                show who holds the lock at <path> (lock status -h)
  lock list [flags]                         list every lock under a prefix (lock list -h)
  lock step-down [flags] <path>             hand the lock over to a waiting standby (lock step-down -h)
  lock lb follow|state [flags] [<path>]     LB sidecar for a task that runs lock (lock lb -h)
  lock version

Runs <command> (no shell, arguments exact) only while it holds a TTL lock on the
Nomad Variable <path>, taken through the Task API socket. The command runs in its
own process group and is stopped the moment the lock is lost. It takes the flags
of nomad var lock, with the same meaning (some defaults differ: see docs/cli.md).
`
	runHelpTail = `
The token comes from NOMAD_TOKEN or $NOMAD_SECRETS_DIR/nomad_token, never from argv.
The workload gets NOMAD_LOCK_PATH and NOMAD_LOCK_FENCE (a fencing token that grows
with every acquisition); with -n N, also NOMAD_LOCK_SLOT (0 to N-1), and the path
is its slot's.

Exit codes: the command's own code (128+N if killed by signal N); 64 config error;
69 Nomad unreachable or API errors; 74 the LB refused the ADD; 75 wait timeout;
76 lock lost; 77 permission denied (the message prints the ACL policy to apply);
126/127 command not executable/found.
`
	lbHelpHead = `Usage:
  lock lb follow [flags] <lock path>   keep this allocation in the LB for each of its tenures
  lock lb state  [flags]               print the service's upstreams

For a Nomad task that holds the lock itself (e.g. a docker task with lock as its
entrypoint), run "lock lb follow" as a poststart sidecar task of the same group.
It follows the lock's holder record: each time this allocation acquires the lock
(first start, task restart, won back) it ADDs the upstream once the health check
passes (tcp on -lb-port if none is given), removing the previous holder's in the
same request; it REMOVEs it when the tenure ends, when the check fails twice in a
row, and when the sidecar is stopped. Give the lock holder -upstream-port with
the same port label: the previous holder's upstream is read from its record.
For a semaphore (the holders run lock -n N <prefix>), give -n N and the prefix:
the allocation is listed while it holds any slot, and each ADD removes the
previous holder of that slot, so at most N holders are listed.
"lock lb add" and "lock lb remove" are retired: they registered once per
allocation only; they now exit 64 and name "lock lb follow".
`
	lbHelpTail = `
Exit codes: 0 done (follow: stopped), 64 config, 69 LB or Nomad unreachable, 74
the LB refused the request, 77 the token cannot read the lock.
`
	statusHelpHead = `Usage:
  lock status [flags] <path>

Shows who holds the lock at <path>, and since when. For a semaphore (lock -n N
<path>), every slot: held or free, by which allocation, its fence and since when.
`
	statusHelpTail = `
Held is true, false or unknown, with how it was known. Nomad shows the lock
itself to management tokens only; for any other token lock status reads the
release mark in the record, asks Nomad with a renew under a lock ID nobody holds
when the token may write the path (the renew changes nothing), and in lease mode
compares the lock with its heartbeat. A holder that died without a release looks
held to a read-only token: it says unknown then, never held (docs/cli.md).
`
	listHelpHead = `Usage:
  lock list [flags]

Lists every lock under -prefix that the token may list, one line each: path,
mode, state, holder allocation, job, since when, fence (as lock status tells).
`
	stepDownHelpHead = `Usage:
  lock step-down [flags] <path>

Asks the holder of the lock at <path> to hand it over to a waiting standby,
without ending its allocation: it stops its workload as for a graceful stop (LB
REMOVE first, kill signal, kill timeout, proof of death), releases the lock, and
waits as a standby again. A gate's allocation is restarted by Nomad for it (its
gated tasks are Nomad's). Returns once another holder has the lock, printing it.
`
	stepDownHelpTail = `
Refused, with no effect (exit 1), when the lock is free, when no standby waits,
when -to names no waiting standby, or when the holder offers no step-down; exit
77 when the token could not release the lock itself (a management token, or the
step-down policy: examples/acl/singleton-step-down.policy.hcl). Exit 0 once the
lock moved as asked; 75 when it did not within the wait (the output says who
holds it). See docs/cli.md and docs/operations.md.
`
	connFlagsTitle = `
Nomad flags (those of Nomad's CLI, with their NOMAD_* variables; for a Nomad
reached over HTTP(S) outside a task, not through the Task API socket):
`
	lbFlagsTitle = `
Load balancer flags (optional; the same fields as the load_balancer and
health_check blocks of -config):
`
)

// helpFor returns the usage function of fs: head, fs's flags (the load
// balancer's apart), tail.
func helpFor(fs *flag.FlagSet, w io.Writer, head, tail string) func() {
	return func() {
		fmt.Fprint(w, head, "\nFlags:\n")
		printFlags(w, fs, func(name string) bool { return !isLBFlag(name) && !isConnFlag(name) })
		if hasFlag(fs, isConnFlag) {
			fmt.Fprint(w, connFlagsTitle)
			printFlags(w, fs, isConnFlag)
		}
		if hasFlag(fs, isLBFlag) {
			fmt.Fprint(w, lbFlagsTitle)
			printFlags(w, fs, isLBFlag)
		}
		fmt.Fprint(w, tail)
	}
}

// isConnFlag: a flag of newConnFlags.
func isConnFlag(name string) bool {
	return slices.Contains([]string{"address", "region", "ca-cert", "ca-path", "client-cert", "client-key",
		"tls-server-name", "tls-skip-verify", "insecure", "no-color", "force-color", "token"}, name)
}

func isLBFlag(name string) bool {
	return strings.HasPrefix(name, "lb-") || strings.HasPrefix(name, "health-")
}

func hasFlag(fs *flag.FlagSet, match func(string) bool) bool {
	found := false
	fs.VisitAll(func(f *flag.Flag) { found = found || match(f.Name) })
	return found
}

const (
	helpWidth  = 80 // wrap the usage text here
	helpColumn = 26 // where the usage text starts
)

// printFlags writes the flags of fs whose names match, in name order, one
// per entry: the flag and its argument, then its usage and default.
func printFlags(w io.Writer, fs *flag.FlagSet, match func(string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !match(f.Name) {
			return
		}
		arg, usage := flagArg(f)
		head := "  -" + f.Name
		if arg != "" {
			head += " " + arg
		}
		if showDefault(f.DefValue) {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprint(w, wrapUsage(head, usage))
	})
}

// flagArg is the name of f's argument ("" for a boolean flag) and its usage:
// a word in backquotes in the usage names the argument, as in the flag
// package; otherwise the flag's type does (a lock setting's kind, or the
// flag package's "duration").
func flagArg(f *flag.Flag) (arg, usage string) {
	arg, usage = flag.UnquoteUsage(f)
	if a, ok := f.Value.(interface{ argName() string }); ok && !strings.Contains(f.Usage, "`") {
		arg = a.argName()
	}
	return strings.ToUpper(arg), usage
}

func showDefault(v string) bool {
	switch v {
	case "", "false", "0", "0s":
		return false
	}
	return true
}

// wrapUsage lays out one flag: head, then usage from helpColumn on, wrapped
// at helpWidth (on the next line when head reaches into the column).
func wrapUsage(head, usage string) string {
	var b strings.Builder
	b.WriteString(head)
	col := len(head)
	if col >= helpColumn-1 {
		b.WriteString("\n")
		col = 0
	}
	line := 0
	for _, word := range strings.Fields(usage) {
		if line > 0 && col+1+len(word) > helpWidth {
			b.WriteString("\n")
			col, line = 0, 0
		}
		if line == 0 {
			b.WriteString(strings.Repeat(" ", helpColumn-col))
			col = helpColumn
		} else {
			b.WriteString(" ")
			col++
		}
		b.WriteString(word)
		col += len(word)
		line++
	}
	b.WriteString("\n")
	return b.String()
}
