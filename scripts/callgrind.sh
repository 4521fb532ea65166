#!/usr/bin/env bash
# Instructions the proxy executes per streamed event and per request, counted by callgrind: unlike
# CPU time on a shared machine, the count repeats to within a fraction of a percent between runs.
#
# Usage: scripts/callgrind.sh [serve options, e.g. --set metering=false]
# Env:   REQUESTS (20), EVENTS (64), TOP (40), DUMP (many, or one: whose functions are listed),
#        SIM_PORT (18101), PROXY_PORT (18102),
#        KEEP=1 keeps the dumps, BIN=path runs that binary instead of building the profiling one
#        (a release binary keeps its symbols: functions are named, lines are not).
# Prints instructions per request (1-event requests) and per event = (I_many - I_one) /
# (REQUESTS x (EVENTS - 1)), all threads of the proxy, user space only; then the functions with
# the most self instructions in the EVENTS-event run (DUMP=one: in the 1-event run).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 2; }
requests=${REQUESTS:-20}
listed=${DUMP:-many}
case "$listed" in
    one | many) ;;
    *) echo "callgrind.sh: DUMP is one or many, not $listed" >&2; exit 2 ;;
esac
events=${EVENTS:-64}
sim_port=${SIM_PORT:-18101}
proxy_port=${PROXY_PORT:-18102}
# The profiling profile is the release build with line tables, so functions have names.
if [ -n "${BIN:-}" ]; then
    bin=$BIN
else
    cargo build --profile profiling --bin tokenmeter >&2
    bin=target/profiling/tokenmeter
fi
dir=$(mktemp -d)
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then echo "callgrind.sh: dumps kept in $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 600); do
        curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
        sleep 0.1
    done
    echo "callgrind.sh: nothing answers on port $1" >&2
    exit 1
}

"$bin" sim --listen "127.0.0.1:$sim_port" --fixed-pace --fixed-ttft-ms 0 --fixed-gap-ms 1 \
    --max-num-seqs 100000 >"$dir/sim.log" 2>&1 &
pids+=($!)
wait_port "$sim_port"
valgrind --tool=callgrind --compress-strings=no --callgrind-out-file="$dir/cg.out" \
    "$bin" serve --listen "127.0.0.1:$proxy_port" --upstream "http://127.0.0.1:$sim_port" \
    --access-log "$dir/access.jsonl" "$@" >"$dir/proxy.log" 2>&1 &
vg_pid=$!
pids+=("$vg_pid")
wait_port "$proxy_port"

run() {
    for _ in $(seq "$1"); do
        curl -sfN "http://127.0.0.1:$proxy_port/v1/chat/completions" \
            -H 'content-type: application/json' -H 'authorization: Bearer sk-callgrind-0123456789' \
            -d "{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":$2,\"stream\":true}" \
            >/dev/null
    done
}
dump_of() { grep -l "^desc: Trigger: dump $1\$" "$dir"/cg.out.* | head -1; }
total() { grep -h '^totals:' "$(dump_of "$1")" | awk '{print $2}'; }

run 5 "$events"
callgrind_control -z "$vg_pid" >/dev/null
run "$requests" 1
callgrind_control -d one "$vg_pid" >/dev/null
run "$requests" "$events"
callgrind_control -d many "$vg_pid" >/dev/null
one=$(total one)
many=$(total many)
echo "serve options: ${*:-none}; $requests requests of 1 and of $events events"
echo "instructions per request (1 event): $((one / requests))"
echo "instructions per event: $(((many - one) / (requests * (events - 1))))"

# Self cost per function. callgrind_annotate 3.19 charges a thread's whole cost to `clone` in dumps
# taken mid-run, so the file is summed here; a cost line right after `calls=` is the inclusive
# cost of a call and is skipped.
if [ "$listed" = one ]; then listed_events=1; else listed_events=$events; fi
echo "most self instructions in the $listed_events-event run:"
awk '/^fn=/ { fn = substr($0, 4); next }
     /^calls=/ { skip = 1; next }
     /^([0-9]|\+|-|\*)/ { if (skip) { skip = 0; next } self[fn] += $2 }
     END { for (f in self) printf "%12d  %s\n", self[f], f }' "$(dump_of "$listed")" |
    sort -rn | head -"${TOP:-40}" | cut -c1-150
