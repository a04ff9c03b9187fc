#!/usr/bin/env bash
# storm-cpus.sh: the heartbeat storm with the registry's side on CPUs of
# its own (BENCHMARKS.md, "The 07:40 run"; docs/OPERATIONS.md, "Registry
# nodes apart from the data plane").
#
# The storm-split scenario of `make bench` runs everything on every CPU;
# this stands in for separate machines by pinning: the storm fleet (and,
# in split mode, Redis and the registry node) on REG_CPU, the data plane
# (the node clients call, its 16-worker fleet and the load generator) on
# DATA_CPU. Windows of storm on and storm paused alternate, as in the
# harness; each prints the data plane's p50/p99 and the storm's ack p99.
#
#   make build && go build -o bin/pinbench ./cmd/pinbench
#   tools/bench/storm-cpus.sh split /tmp/storm-split   # registry node apart (Redis)
#   tools/bench/storm-cpus.sh mem /tmp/storm-mem       # one node doing both (memory:)
#
# Environment: REG_CPU (0), DATA_CPU (1), RATE (1000 req/s), ROUNDS (3),
# WORKERS (10000), PB (bin/pinboard), PINBENCH (bin/pinbench), REDIS_PORT
# (16390), PORT (18181; the data node takes PORT+1). Needs redis-server,
# curl, taskset and python3; 127.0.0.1 only; stops everything it started.
set -euo pipefail
MODE=${1:?usage: storm-cpus.sh split|mem OUTDIR}
OUT=${2:?usage: storm-cpus.sh split|mem OUTDIR}
REG_CPU=${REG_CPU:-0} DATA_CPU=${DATA_CPU:-1} RATE=${RATE:-1000} ROUNDS=${ROUNDS:-3} WORKERS=${WORKERS:-10000}
PB=$(realpath "${PB:-bin/pinboard}") PINBENCH=$(realpath "${PINBENCH:-bin/pinbench}")
REDIS_PORT=${REDIS_PORT:-16390} PORT=${PORT:-18181}
case $MODE in split | mem) ;; *) echo "storm-cpus.sh: mode must be split or mem, got $MODE" >&2; exit 2 ;; esac
mkdir -p "$OUT" && cd "$OUT"
# cpu() reads every node-*.pid here: one left by the other mode in the
# same OUTDIR names a process that is gone (or another one).
rm -f node-*.pid
ulimit -n 20000

PASSPORT='{"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"bench","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}'
export PINBOARD_TOKEN=storm-cpus-token-not-a-secret
: >pids
cleanup() {
	# shellcheck disable=SC2046
	kill $(cat pids) 2>/dev/null || true
	sleep 5
	# shellcheck disable=SC2046
	kill -9 $(cat pids) 2>/dev/null || true
}
trap cleanup EXIT

# in_use PORT: something already listens there (a node or Redis left by
# an earlier run would otherwise answer for the one started here).
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# node PORT REDIS_URL NAME CPUS
node() {
	if in_use "$1"; then
		echo "storm-cpus.sh: port $1 is in use (PORT)" >&2
		exit 1
	fi
	PORT=$1 HOST=127.0.0.1 PINBOARD_PASSPORT=$PASSPORT REDIS_URL=$2 PINBOARD_LOG_LEVEL=warn \
		taskset -c "$4" "$PB" >"$3.log" 2>&1 &
	echo $! >>pids
	echo $! >"$3.pid"
	for _ in $(seq 100); do
		curl -sf "http://127.0.0.1:$1/livez" >/dev/null && return
		sleep 0.1
	done
	echo "storm-cpus.sh: $3 did not start; see $OUT/$3.log" >&2
	exit 1
}

# fleet NAME PINBOARD_URL WORKERS LISTENERS NS CPUS: prints the control address
fleet() {
	taskset -c "$6" "$PINBENCH" fleet -pinboard "$2" -workers "$3" -listeners "$4" -ns "$5" -register-timeout 5m >"$1.out" 2>"$1.log" &
	local pid=$!
	echo "$pid" >>pids
	for _ in $(seq 3000); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "storm-cpus.sh: fleet $1 exited; see $OUT/$1.log" >&2
			exit 1
		fi
		c=$(grep -o '"control":"[^"]*"' "$1.out" | cut -d'"' -f4 || true)
		if [ -n "$c" ]; then
			echo "$c"
			return
		fi
		sleep 0.1
	done
	echo "storm-cpus.sh: fleet $1 did not register; see $OUT/$1.log" >&2
	exit 1
}

cpu() { # the summed utime+stime ticks of the nodes
	for f in node-*.pid; do awk '{print $14+$15}' "/proc/$(cat "$f")/stat"; done | paste -sd' '
}

if [ "$MODE" = mem ]; then
	node "$PORT" memory: node-data "$DATA_CPU" # one node doing both
	REG=http://127.0.0.1:$PORT
else
	if in_use "$REDIS_PORT"; then
		echo "storm-cpus.sh: port $REDIS_PORT is in use (REDIS_PORT)" >&2
		exit 1
	fi
	taskset -c "$REG_CPU" redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no >redis.log 2>&1 &
	echo $! >>pids
	sleep 0.5
	if ! kill -0 "$(tail -n1 pids)" 2>/dev/null; then
		echo "storm-cpus.sh: redis-server exited; see $OUT/redis.log" >&2
		exit 1
	fi
	node "$PORT" "redis://127.0.0.1:$REDIS_PORT" node-registry "$REG_CPU"
	node $((PORT + 1)) "redis://127.0.0.1:$REDIS_PORT" node-data "$DATA_CPU"
	REG=http://127.0.0.1:$PORT
fi
DATA=127.0.0.1:$([ "$MODE" = mem ] && echo "$PORT" || echo $((PORT + 1)))

fleet fleet "$REG" 16 4 /bench "$DATA_CPU" >/dev/null
# The cold-start quarantine (one lease), then 100 ids placed. Each
# window requests one of them (the harness spreads over all its hot ids).
placed=
for _ in $(seq 600); do
	if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$DATA/bench/h0/json")" = 200 ]; then
		placed=1
		break
	fi
	sleep 0.1
done
if [ -z "$placed" ]; then
	echo "storm-cpus.sh: no placement through $DATA within 60 s; see $OUT/node-*.log" >&2
	exit 1
fi
for j in $(seq 0 99); do
	code=$(curl -s -o /dev/null -w '%{http_code}' "http://$DATA/bench/h$j/json")
	if [ "$code" != 200 ]; then
		echo "storm-cpus.sh: placing h$j answered $code" >&2
		exit 1
	fi
done
STORM=$(fleet storm "$REG" "$WORKERS" 64 /storm "$REG_CPU")
echo "$MODE: $WORKERS storm workers registered"
sleep 9.5 # past the registrations' aftermath, as in the harness

for r in $(seq "$ROUNDS"); do
	phases="on off"
	[ $((r % 2)) = 0 ] && phases="off on"
	for p in $phases; do
		if [ "$p" = off ]; then
			curl -sf -XPOST "http://$STORM/pause" >/dev/null
			sleep 0.3
		fi
		curl -sf "http://$STORM/stats?reset=1" >/dev/null
		c0=$(cpu) t0=$(date +%s.%N)
		taskset -c "$DATA_CPU" "$PINBENCH" load -addr "$DATA" -rate "$RATE" -d 6s -c 64 \
			-path "/bench/h$((r * 7 % 100))/json" -json "load-$r-$p.json" >/dev/null 2>&1
		curl -sf "http://$STORM/stats?reset=1" >"acks-$r-$p.json"
		c1=$(cpu) t1=$(date +%s.%N)
		if [ "$p" = off ]; then
			curl -sf -XPOST "http://$STORM/resume" >/dev/null
			sleep 3
		fi
		python3 - "$MODE" "$r" "$p" "$c0" "$c1" "$t0" "$t1" "load-$r-$p.json" "acks-$r-$p.json" <<'EOF'
import json, sys
mode, r, p, c0, c1, t0, t1, load, acks = sys.argv[1:]
wall = float(t1) - float(t0)  # CPU ticks are 1/100 s (USER_HZ)
d, a = json.load(open(load)), json.load(open(acks))
cores = " ".join("%.2f" % ((int(y) - int(x)) / 100 / wall) for x, y in zip(c0.split(), c1.split()))
print("%s round %s storm %-3s data plane p50 %5.0f µs p99 %6.0f µs ok %d errors %s | acks %d p99 %.1f ms | cores: data node %s"
      % (mode, r, p, d["latencyUs"]["p50"], d["latencyUs"]["p99"], d["ok"], d.get("errors") or 0,
         a.get("heartbeats", 0), a.get("ackP99us", 0) / 1000, cores.replace(" ", ", registry node ", 1) if mode == "split" else cores))
EOF
	done
done
