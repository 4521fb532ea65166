#!/usr/bin/env bash
# Overhead benchmark: tokenmeter vs the simulator alone vs nginx, on loopback.
# Usage: scripts/overhead.sh [harness options, e.g. --quick | --nginx-workers auto | --issue37]
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

# The peers phase (--phases peers, --issue37) runs Python peers: the openai SDK and what it pulls
# in, pinned in tests/sdk/requirements.txt, go into a virtualenv kept in target/peers-venv and
# rebuilt when the requirements change.
peers_arg=()
if [[ " $* " == *" --issue37 "* || " $* " == *peers* ]]; then
    venv=target/peers-venv
    req=tests/sdk/requirements.txt
    want=$(sha256sum "$req" | cut -d' ' -f1)
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
        echo "overhead.sh: creating $venv from $req" >&2
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
        echo "$want" > "$venv/.requirements.sha256"
    fi
    peers_arg=(--python "$venv/bin/python")
fi

cargo build --profile dist --bin tokenmeter
exec cargo bench --bench overhead -- "${nginx_arg[@]}" "${peers_arg[@]}" --bin target/dist/tokenmeter "$@"
