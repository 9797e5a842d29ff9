#!/usr/bin/env bash
# Kills the sign-up example (SIGKILL) and runs it again, ROUNDS times, after one whole
# scenario (--fresh); counts the reruns that passed, failed, and that ignored replies to a
# killed run's audit. The issue 21 reproduction, counting instead of stopping at a failure.
#
#   scripts/signup-kill-loop.sh ROUNDS [random|audit] [signup arguments...]
#
# random: each run is killed 0.04-0.11 s after it starts (the issue's timing);
# audit:  each run is killed 0-15 ms after it prints "where the users stand:", which a
#         resumed run whose users are all settled follows with its final audit at once.
# The mode is the example's own: the embedded file of --db (default), or Postgres /
# RabbitMQ + Postgres with DATABASE_URL / AMQP_URL set. Build it first (with its servers):
#   cargo build -p courier-examples --features servers --bin signup
# A failed rerun's output is kept in signup-kill-loop-fail-N.out.
set -uo pipefail

rounds=${1:?usage: signup-kill-loop.sh ROUNDS [random|audit] [signup arguments...]}
mode=${2:-random}
shift $(($# >= 2 ? 2 : 1))
S=${SIGNUP:-"$(dirname "$0")/../target/debug/signup"}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"$S" --fresh "$@" >"$out" 2>&1 || { cat "$out"; echo "the first, whole run failed" >&2; exit 1; }
pass=0 fail=0 ignored=0
for i in $(seq "$rounds"); do
    case "$mode" in
    random)
        "$S" "$@" >/dev/null 2>&1 &
        p=$!
        sleep "0.$(printf '%02d' $((RANDOM % 8 + 4)))"
        ;;
    audit)
        coproc RUN { exec "$S" "$@" 2>/dev/null; }
        p=$RUN_PID
        while IFS= read -r line <&"${RUN[0]}"; do [ "$line" = "where the users stand:" ] && break; done
        sleep "$(printf '0.%03d' $((RANDOM % 16)))"
        ;;
    *) echo "unknown mode $mode (random or audit)" >&2; exit 2 ;;
    esac
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    if "$S" "$@" >"$out" 2>&1; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        cp "$out" "signup-kill-loop-fail-$i.out"
    fi
    grep -q "to other audits" "$out" && ignored=$((ignored + 1))
done
echo "$rounds rounds ($mode): $pass passed, $fail failed; $ignored reruns ignored replies to another audit"
[ "$fail" -eq 0 ]
