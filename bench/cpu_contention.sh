#!/usr/bin/env bash
# cpu_contention.sh — the demo (toy model + derived draft, k = 4) on the CPU backend at 1 and 2
# threads, alone and beside BUSY busy processes (`yes > /dev/null`; default 1),
# under each OpenMP wait policy of POLICIES: `passive` (idle threads sleep at once), `active`
# (they spin), `spin=N` (they spin N rounds, then sleep: GOMP_SPINCOUNT=N), `default` (libgomp's
# own, GOMP_SPINCOUNT=300000). Prints the median tokens/s of REPS runs per cell and the load
# average before each; the cells of a row are run interleaved, rep by rep, so that a change in the
# machine's other load falls on all of them alike.
#
#   [POLICIES="passive active"] [BUSY=1] bench/cpu_contention.sh [BUILD_DIR] [REPS]   (build, 3)
set -euo pipefail
build=${1:-build}
reps=${2:-3}
bin=$build/specdec
[ -x "$bin" ] || { echo "cpu_contention.sh: $bin not built" >&2; exit 2; }
nbusy=${BUSY:-1}

read -r -a policies <<< "${POLICIES:-passive active}"

# tokens/s of one demo run at $1 threads under policy $2.
tps() {
    local env=(OMP_WAIT_POLICY=passive)
    case $2 in
    passive) ;;
    active) env=(OMP_WAIT_POLICY=active) ;;
    default) env=(OMP_WAIT_POLICY=active GOMP_SPINCOUNT=300000) ;;
    spin=*) env=(OMP_WAIT_POLICY=passive GOMP_SPINCOUNT="${2#spin=}") ;;
    *) echo "cpu_contention.sh: unknown policy '$2'" >&2; exit 2 ;;
    esac
    env "${env[@]}" "$bin" run --backend cpu --threads "$1" --json 2>/dev/null |
        sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p'
}

median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }

busy=()
start_busy() { for _ in $(seq "$nbusy"); do yes > /dev/null & busy+=($!); done; }
stop_busy() {
    [ ${#busy[@]} -gt 0 ] || return 0
    kill "${busy[@]}"
    wait "${busy[@]}" 2>/dev/null || true
    busy=()
}
trap stop_busy EXIT

echo "$(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)); $reps runs per cell, the median"
printf '%-8s %-8s %-13s %10s   %s\n' threads beside policy tokens/s "load average before the row (1, 5, 15 min)"
for neighbour in none yes; do
    [ "$neighbour" = yes ] && start_busy
    for threads in 1 2; do
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        declare -A runs=()
        for _ in $(seq "$reps"); do
            for p in "${policies[@]}"; do runs[$p]+="$(tps "$threads" "$p") "; done
        done
        for p in "${policies[@]}"; do
            # shellcheck disable=SC2086
            printf '%-8s %-8s %-13s %10.1f   %s\n' "$threads" "$neighbour" "$p" "$(median ${runs[$p]})" "$load"
        done
        unset runs
    done
    [ "$neighbour" = yes ] && stop_busy
done
