#!/usr/bin/env bash
# `make demo`: a dev agent with the singleton driver loaded, the example
# singleton job with count=3, and the commands to watch a failover. Runs until
# Ctrl-C, then stops the job and the agent and removes its files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin
work=$(mktemp -d /tmp/singleton-demo.XXXXXX)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
http=$(free_port) rpc=$(free_port) serf=$(free_port)
export NOMAD_ADDR=http://127.0.0.1:$http
unset NOMAD_TOKEN

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

"$bin/nomad" agent -dev -plugin-dir="$bin/plugins" -config="$work/agent.hcl" >"$work/agent.log" 2>&1 &
agent=$!
cleanup() {
  trap - EXIT INT TERM
  echo
  echo "stopping the demo job and the agent..."
  "$bin/nomad" job stop -purge web >/dev/null 2>&1 || true
  kill -INT "$agent" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$agent" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$agent" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "starting nomad agent -dev on $NOMAD_ADDR (log: $work/agent.log)"
for _ in $(seq 1 120); do
  if "$bin/nomad" node status -self -verbose 2>/dev/null | grep -q 'driver.singleton '; then break; fi
  kill -0 "$agent" 2>/dev/null || { tail -20 "$work/agent.log"; exit 1; }
  sleep 0.5
done

"$bin/nomad" job run -detach "$root/examples/singleton.nomad.hcl" >/dev/null
lock_path=nomad/jobs/web/web/server/lock
for _ in $(seq 1 60); do
  if "$bin/lock" status "$lock_path" 2>/dev/null | grep -q '^Held *= true'; then break; fi
  sleep 0.5
done
echo
"$bin/nomad" job status web | sed -n '/^Allocations/,$p'
echo
"$bin/lock" status "$lock_path"
holder=$("$bin/lock" status -json "$lock_path" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Holder"]["AllocID"])')

cat <<MSG

One of the three allocations holds the lock and runs the workload; the other
two wait. In another shell:

  export NOMAD_ADDR=$NOMAD_ADDR
  $bin/lock status $lock_path          # who holds it, with the fence
  $bin/nomad alloc status $holder      # "Acquired lock (fence N)" in the events
  $bin/nomad alloc stop $holder        # graceful handover: a standby takes over in well under a second
  $bin/lock status $lock_path          # a new holder, a higher fence
  kill -9 \$(pgrep -f "__singleton-supervise .*/$holder/")   # crash: takeover after 2*TTL + delay

Press Ctrl-C to stop the demo.
MSG
wait "$agent"
