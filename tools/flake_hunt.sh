#!/usr/bin/env bash
# Flake hunt: find the failures that CI would otherwise find at random.
#   1. every property test (the modules that use Hypothesis) under SEEDS different seeds;
#   2. every test but the e2e (what .ci/run runs beside the Go builds) ROUNDS times in a row while
#      stress-ng keeps both cores busy.
# Every failure is listed at the end with its seed or round; the exit status is 1 if there was any.
# Usage: tools/flake_hunt.sh [ROUNDS (default 3)] [SEEDS (default 20)]; needs what .ci/run installs,
# plus stress-ng (apt-get install stress-ng).
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seeds=${2:-20}
logs="$(mktemp -d /tmp/flake-hunt.XXXXXX)"
failures=()

mapfile -t property_modules < <(grep -rlE '^from hypothesis|^import hypothesis' tests | sort)
echo "== ${#property_modules[@]} property modules x $seeds seeds (logs: $logs)"
for seed in $(seq 1 "$seeds"); do
    seed_value=$((seed * 7919))
    if ! python3 -m pytest -q -p no:cacheprovider -n 2 --hypothesis-seed="$seed_value" \
        "${property_modules[@]}" >"$logs/seed-$seed_value.log" 2>&1; then
        failures+=("property tests, --hypothesis-seed=$seed_value: $logs/seed-$seed_value.log")
    fi
    echo "   seed $seed_value: $(grep -E '(passed|failed)' "$logs/seed-$seed_value.log" | tail -1)"
done

command -v stress-ng >/dev/null || { echo "stress-ng not found: apt-get install stress-ng" >&2; exit 2; }
stress-ng --cpu 2 --quiet &
stress=$!
trap 'kill "$stress" 2>/dev/null; wait "$stress" 2>/dev/null' EXIT
for round in $(seq 1 "$rounds"); do
    started=$(date +%s)
    if ! SOAK_REQUIRE_ALL=1 python3 -m pytest -m "not e2e" -n "${SOAK_CI_WORKERS:-3}" \
        --dist loadfile -p no:cacheprovider >"$logs/round-$round.log" 2>&1; then
        failures+=("all but the e2e under stress-ng --cpu 2, round $round: $logs/round-$round.log")
    fi
    echo "   round $round ($(($(date +%s) - started)) s): $(grep -E '(passed|failed)' "$logs/round-$round.log" | tail -1)"
done

echo "== ${#failures[@]} failing runs"
for failure in "${failures[@]}"; do echo "   $failure"; done
((${#failures[@]} == 0))
