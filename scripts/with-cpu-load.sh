#!/usr/bin/env bash
# Runs a command with a busy loop on every core for as long as it runs, so that timing races show on a developer's
# machine or in CI rather than in a user's job (issue #17). The command's exit status is passed on.
#
#   scripts/with-cpu-load.sh [-j N] -- COMMAND [ARGS...]
#
# -j N: N busy loops instead of one per core (nproc). The loops stop when the command ends, when this script is
# interrupted (SIGINT/SIGTERM/SIGHUP are passed on to the command), and, should this script itself be SIGKILLed,
# on their own: each checks every few milliseconds that this script is still alive.
set -euo pipefail

loops=$(nproc)
while [ $# -gt 0 ]; do
    case "$1" in
        -j)
            [ $# -ge 2 ] || { echo "with-cpu-load.sh: -j needs a number" >&2; exit 2; }
            loops=$2
            shift 2
            ;;
        --)
            shift
            break
            ;;
        *)
            break
            ;;
    esac
done
case "$loops" in
    '' | *[!0-9]*) echo "with-cpu-load.sh: -j $loops is not a number of loops" >&2; exit 2 ;;
esac
[ $# -gt 0 ] || { echo "usage: with-cpu-load.sh [-j N] -- COMMAND [ARGS...]" >&2; exit 2; }

me=$$
load=()
stop_load() {
    for pid in "${load[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${load[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap stop_load EXIT
for _ in $(seq "$loops"); do
    # Busy, but checks about every 10,000 rounds (a few ms) that this script still runs.
    ( while kill -0 "$me" 2>/dev/null; do for ((i = 0; i < 10000; i++)); do :; done; done ) &
    load+=($!)
done
echo "with-cpu-load.sh: $loops busy loop(s) running beside: $*" >&2

"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM HUP
# `wait` returns early when a trapped signal arrives; wait again until the command has really ended.
while :; do
    status=0
    wait "$child" || status=$?
    kill -0 "$child" 2>/dev/null || break
done
exit "$status"
