#!/usr/bin/env bash
# `make demo`: a dev agent with the singleton driver loaded and a count=3
# singleton job, then the commands to watch a failover. With HAProxy
# installed (`make demo` installs it with apt-get where it may), the job is
# examples/whoami behind a real HAProxy, driven by the reference LB API
# (bin/lbapi -haproxy-socket), so `curl` shows which allocation holds the
# lock; without it, the plain example job. Runs until Ctrl-C, then stops the
# job, the LB API, HAProxy and the agent (each by its PID) and removes its
# files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin
work=$(mktemp -d /tmp/singleton-demo.XXXXXX)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
http=$(free_port) rpc=$(free_port) serf=$(free_port)
export NOMAD_ADDR=http://127.0.0.1:$http
unset NOMAD_TOKEN

haproxy_bin=$(command -v haproxy || true)
[ -z "$haproxy_bin" ] && [ -x /usr/sbin/haproxy ] && haproxy_bin=/usr/sbin/haproxy

cat >"$work/agent.hcl" <<HCL
bind_addr = "127.0.0.1"
ports {
  http = $http
  rpc  = $rpc
  serf = $serf
}
plugin "nomad-driver-singleton" {
  config {
    default_ttl   = "10s"
    default_delay = "1s"
  }
}
client {
  options {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
}
HCL

agent= haproxy_pid= lbapi_pid=
stop_pid() { # pid: SIGTERM, up to 10 s, then SIGKILL
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "stopping the demo job, the LB API, HAProxy and the agent..."
  # The job first: its holder removes itself from the LB on the way out.
  # Its supervisors outlive an agent by design, so wait (up to 20 s) until
  # no allocation runs before the agent goes.
  if [ -n "$agent" ]; then
    "$bin/nomad" job stop web >/dev/null 2>&1 || true
    for _ in $(seq 1 100); do
      "$bin/nomad" job allocs -t '{{range .}}{{if eq .ClientStatus "running"}}running {{end}}{{end}}' web 2>/dev/null | grep -q running || break
      sleep 0.2
    done
    "$bin/nomad" job stop -purge web >/dev/null 2>&1 || true
  fi
  stop_pid "$lbapi_pid"
  stop_pid "$haproxy_pid"
  if [ -n "$agent" ]; then
    kill -INT "$agent" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$agent" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$agent" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

"$bin/nomad" agent -dev -plugin-dir="$bin/plugins" -config="$work/agent.hcl" >"$work/agent.log" 2>&1 &
agent=$!
echo "starting nomad agent -dev on $NOMAD_ADDR (log: $work/agent.log)"

if [ -n "$haproxy_bin" ]; then
  front=$(free_port) lbport=$(free_port)
  sock=$work/haproxy.sock
  # One frontend; the backend "web" has a fixed pool of server slots that
  # the LB API points at the holder at run time (what
  # examples/lbapi/haproxy.Config renders). Retries with redispatch carry a
  # request whose server died over to the successor.
  cat >"$work/haproxy.cfg" <<CFG
global
    stats socket $sock level admin mode 600
    stats timeout 10s

defaults
    mode http
    option redispatch 1
    retries 3
    timeout connect 1s
    timeout queue 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 5s

frontend lbapi
    bind 127.0.0.1:$front
    use_backend web if { path /web } || { path_beg /web/ }
    default_backend web

backend web
    balance roundrobin
    server-template slot 1-8 127.0.0.1:1 disabled
CFG
  "$haproxy_bin" -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
  haproxy_pid=$!
  for _ in $(seq 1 50); do
    [ -S "$sock" ] && break
    kill -0 "$haproxy_pid" 2>/dev/null || { echo "haproxy exited:"; tail -n 20 "$work/haproxy.log"; exit 1; }
    sleep 0.2
  done
  "$bin/lbapi" -listen "127.0.0.1:$lbport" -groups web-lb -worker-interval 100ms \
    -haproxy-socket "$sock" >"$work/lbapi.log" 2>&1 &
  lbapi_pid=$!
  lb_uri=http://127.0.0.1:$lbport/baragon/v2/request
  for _ in $(seq 1 50); do
    grep -q "driving HAProxy" "$work/lbapi.log" 2>/dev/null && break
    sleep 0.2
  done
  grep -q "driving HAProxy" "$work/lbapi.log" || { echo "the LB API does not reach HAProxy:"; tail -n 5 "$work/lbapi.log" "$work/haproxy.log"; exit 1; }
  echo "HAProxy $("$haproxy_bin" -v | sed -n '1s/HAProxy version \([^ ]*\).*/\1/p') on http://127.0.0.1:$front (log: $work/haproxy.log)"
  echo "LB API on $lb_uri, driving HAProxy through $sock (log: $work/lbapi.log)"
else
  echo "haproxy is not installed (and could not be installed here): running the demo without a load balancer"
fi

for _ in $(seq 1 120); do
  if "$bin/nomad" node status -self -verbose 2>/dev/null | grep -q 'driver.singleton '; then break; fi
  kill -0 "$agent" 2>/dev/null || { tail -n 20 "$work/agent.log"; exit 1; }
  sleep 0.5
done

lock_path=nomad/jobs/web/web/server/lock
if [ -n "$haproxy_bin" ]; then
  "$bin/nomad" job run -detach -var "whoami=$bin/whoami" -var "lb_uri=$lb_uri" "$root/examples/singleton-haproxy.nomad.hcl" >/dev/null
else
  "$bin/nomad" job run -detach "$root/examples/singleton.nomad.hcl" >/dev/null
fi
for _ in $(seq 1 60); do
  if "$bin/lock" status "$lock_path" 2>/dev/null | grep -q '^Held *= true'; then break; fi
  sleep 0.5
done
echo
"$bin/nomad" job status web | sed -n '/^Allocations/,$p'
echo
"$bin/lock" status "$lock_path"
holder=$("$bin/lock" status -json "$lock_path" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Holder"]["AllocID"])')

if [ -z "$haproxy_bin" ]; then
  cat <<MSG

One of the three allocations holds the lock and runs the workload; the other
two wait. In another shell:

  export NOMAD_ADDR=$NOMAD_ADDR
  $bin/lock status $lock_path          # who holds it, with the fence
  $bin/nomad alloc status $holder      # "Acquired lock (fence N)" in the events
  $bin/nomad alloc stop $holder        # graceful handover: a standby takes over in well under a second
  $bin/lock status $lock_path          # a new holder, a higher fence
  kill -9 \$(pgrep -f "__singleton-supervise .*/$holder/")   # crash: the plugin releases the lock for it

Press Ctrl-C to stop the demo.
MSG
  wait "$agent"
  exit 0
fi

url=http://127.0.0.1:$front/web/
for _ in $(seq 1 100); do
  curl -fsS "$url" 2>/dev/null | grep -q "alloc $holder" && break
  sleep 0.2
done
echo
echo "\$ curl $url"
curl -sS "$url" || true
cat <<MSG

One of the three allocations holds the lock and runs whoami; the other two
wait. The holder registered itself with the LB API, which made it the one
server of HAProxy's backend "web". In another shell:

  export NOMAD_ADDR=$NOMAD_ADDR
  curl $url                         # "alloc <holder> fence N"
  while sleep 0.2; do curl -s $url; done   # leave this running in a third shell

  $bin/nomad alloc stop $holder
      # graceful handover: the holder is removed from HAProxy, then stopped; a
      # standby takes the lock, passes its health check and is added: the curl
      # loop shows the new alloc ID (and a 503 or two while no one is in)
  kill -9 \$(pgrep -f "__singleton-supervise .*/$holder/")
      # crash of the holder's supervisor: the plugin removes the dead upstream
      # and releases the lock; the next holder's request swaps itself in;
      # requests caught on the dead holder are retried on the successor

  echo "show servers state web" | python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect("$sock"); s.sendall(sys.stdin.read().encode()); print(s.makefile().read())'
  curl -s ${lb_uri%/request}/state/web      # the LB API's view: what HAProxy actually serves
  $bin/lock status $lock_path

Press Ctrl-C to stop the demo.
MSG
wait "$agent"
