package haproxy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// header26 is the header HAProxy 2.6.12 prints.
const header26 = "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port"

func TestParseServersState(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []ServerState
		err  string // substring of the error; "" for none
	}{
		{name: "empty backend", in: "1\n" + header26 + "\n\n", want: nil},
		{
			name: "fresh dynamic server, then one enabled",
			in: "1\n" + header26 + "\n" +
				"3 web 1 127.0.0.1:9999 127.0.0.1 0 1 1 1 0 1 0 0 0 0 0 0 - 9999 - 0 0 - - 0\n" +
				"3 web 2 10.0.0.7:8080 10.0.0.7 2 0 1 1 4 1 0 0 0 0 0 0 - 8080 - 0 0 - - 0\n",
			want: []ServerState{
				{Backend: "web", BackendID: 3, Name: "127.0.0.1:9999", ID: 1, Addr: "127.0.0.1", Port: 9999, OpState: OpStopped, AdminState: AdminForcedMaint},
				{Backend: "web", BackendID: 3, Name: "10.0.0.7:8080", ID: 2, Addr: "10.0.0.7", Port: 8080, OpState: OpRunning},
			},
		},
		{
			name: "columns found by name, extra ones ignored",
			in:   "1\n# srv_port srv_name be_name be_id srv_id srv_addr srv_admin_state srv_op_state future_col\n80 a b 7 9 ::1 8 2 x\n",
			want: []ServerState{{Backend: "b", BackendID: 7, Name: "a", ID: 9, Addr: "::1", Port: 80, OpState: OpRunning, AdminState: AdminForcedDrain}},
		},
		{name: "refusal instead of a dump", in: "Can't find backend.\n", err: `format version "Can't find backend."`},
		{name: "no header", in: "1\n", err: "no header line"},
		{name: "server before header", in: "1\n3 web 1 a 127.0.0.1 2 0\n", err: "before the header"},
		{name: "header lacks a column", in: "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n", err: "lacks column srv_port"},
		{name: "short line", in: "1\n" + header26 + "\n3 web 1 a 127.0.0.1 2 0\n", err: "7 fields, the header names 25"},
		{name: "not a number", in: "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_port\n3 web 1 a 127.0.0.1 up 0 80\n", err: `srv_op_state "up" is not a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseServersState(tc.in)
			if tc.err != "" {
				var pe *ParseError
				if err == nil || !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want a ParseError containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestServerStateReadyAndAddress(t *testing.T) {
	for _, tc := range []struct {
		st    ServerState
		ready bool
		addr  string
	}{
		{ServerState{Addr: "127.0.0.1", Port: 80, OpState: OpRunning}, true, "127.0.0.1:80"},
		{ServerState{Addr: "::1", Port: 80, OpState: OpRunning}, true, "[::1]:80"},
		{ServerState{Addr: "127.0.0.1", Port: 80, OpState: OpStopped, AdminState: AdminForcedMaint}, false, "127.0.0.1:80"},
		{ServerState{Addr: "127.0.0.1", Port: 80, OpState: OpRunning, AdminState: AdminForcedDrain}, false, "127.0.0.1:80"},
		{ServerState{Addr: "127.0.0.1", Port: 80, OpState: OpStopping}, false, "127.0.0.1:80"},
	} {
		if got := tc.st.Ready(); got != tc.ready {
			t.Errorf("%+v: Ready() = %v, want %v", tc.st, got, tc.ready)
		}
		if got := tc.st.Address(); got != tc.addr {
			t.Errorf("%+v: Address() = %q, want %q", tc.st, got, tc.addr)
		}
	}
}
