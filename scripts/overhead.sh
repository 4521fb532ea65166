#!/usr/bin/env bash
# Overhead benchmark: tokenmeter vs the simulator alone vs nginx, on loopback.
# Usage: scripts/overhead.sh [harness options, e.g. --quick | --nginx-workers auto]
# Installs nginx when absent (Debian/Ubuntu, as root); without it the nginx arm is skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."

nginx_arg=()
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "overhead.sh: nginx not found, installing it with apt-get" >&2
        apt-get update -qq && apt-get install -y -qq nginx >/dev/null || true
    fi
fi
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "overhead.sh: NOTE nginx unavailable: the nginx arm is skipped and targets against it are not measured" >&2
    nginx_arg=(--nginx none)
fi

# 10,000 streams need ~20,000 descriptors in the proxy; raise the limit as far as allowed.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true
echo "overhead.sh: open-files limit $(ulimit -n); load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

cargo build --profile dist --bin tokenmeter
exec cargo bench --bench overhead -- "${nginx_arg[@]}" --bin target/dist/tokenmeter "$@"
