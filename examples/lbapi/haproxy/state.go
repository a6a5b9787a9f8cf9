package haproxy

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Operational states (srv_op_state).
const (
	OpStopped  = 0
	OpStarting = 1
	OpRunning  = 2
	OpStopping = 3
)

// Administrative state bits (srv_admin_state); 0 is ready.
const (
	AdminForcedMaint    = 0x01 // set server … state maint, or a slot declared `disabled`
	AdminInheritedMaint = 0x02 // tracks a server in maintenance
	AdminConfigMaint    = 0x04 // `disabled` in the configuration; stays set once the server is made ready
	AdminForcedDrain    = 0x08
	AdminInheritedDrain = 0x10
	AdminResolveMaint   = 0x20 // its name does not resolve
	AdminHostnameMaint  = 0x40
)

// ServerState is one line of `show servers state` (format version 1).
type ServerState struct {
	Backend    string
	BackendID  int
	Name       string
	ID         int
	Addr       string // IP address
	Port       int
	OpState    int
	AdminState int
}

// Address is addr:port.
func (s ServerState) Address() string { return net.JoinHostPort(s.Addr, strconv.Itoa(s.Port)) }

// Ready reports a server that takes traffic: running and in no maintenance
// or drain state. AdminConfigMaint alone does not count: a slot declared
// `disabled` keeps that bit after `set server … state ready` clears the
// forced maintenance it came with, and serves.
func (s ServerState) Ready() bool {
	return s.OpState == OpRunning && s.AdminState&^AdminConfigMaint == 0
}

// ParseError is a `show servers state` dump that could not be read.
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("show servers state, line %d: %s", e.Line, e.Msg)
}

// ParseServersState reads the output of `show servers state [backend]`: a
// format version line ("1"), a "# be_id be_name …" header naming the
// columns, then one line per server. Columns are found by name, so fields
// HAProxy appends in later versions are ignored.
func ParseServersState(out string) ([]ServerState, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if strings.TrimSpace(lines[0]) != "1" {
		return nil, &ParseError{Line: 1, Msg: fmt.Sprintf("format version %q, want 1", strings.TrimSpace(lines[0]))}
	}
	var cols map[string]int
	var states []ServerState
	for i, raw := range lines[1:] {
		n := i + 2
		line := strings.TrimSpace(raw)
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			cols = map[string]int{}
			for j, name := range strings.Fields(strings.TrimPrefix(line, "#")) {
				cols[name] = j
			}
			for _, need := range []string{"be_id", "be_name", "srv_id", "srv_name", "srv_addr", "srv_op_state", "srv_admin_state", "srv_port"} {
				if _, ok := cols[need]; !ok {
					return nil, &ParseError{Line: n, Msg: "header lacks column " + need}
				}
			}
			continue
		}
		if cols == nil {
			return nil, &ParseError{Line: n, Msg: "server line before the header"}
		}
		f := strings.Fields(line)
		if len(f) < len(cols) {
			return nil, &ParseError{Line: n, Msg: fmt.Sprintf("%d fields, the header names %d", len(f), len(cols))}
		}
		var st ServerState
		var err error
		num := func(col string) int {
			v, e := strconv.Atoi(f[cols[col]])
			if e != nil && err == nil {
				err = &ParseError{Line: n, Msg: fmt.Sprintf("%s %q is not a number", col, f[cols[col]])}
			}
			return v
		}
		st.Backend, st.Name, st.Addr = f[cols["be_name"]], f[cols["srv_name"]], f[cols["srv_addr"]]
		st.BackendID, st.ID, st.Port = num("be_id"), num("srv_id"), num("srv_port")
		st.OpState, st.AdminState = num("srv_op_state"), num("srv_admin_state")
		if err != nil {
			return nil, err
		}
		states = append(states, st)
	}
	if cols == nil {
		return nil, &ParseError{Line: 2, Msg: "no header line"}
	}
	return states, nil
}
