#!/usr/bin/env bash
# make test's three stages, each in its folder of tests/: unit (pure, no root), emulation (root,
# real Open vSwitch, Mininet, controller processes) and the full-kernel lane (a stock Debian
# kernel under qemu: its own tests, tests/kernel, then tests/remote with its guest as the second
# machine). Called by `make test` with PYTEST, UNIT_ARGS, EMU_ARGS and MAKE set.
#
# The emulation stage mostly waits (on links, timers and processes: 0.86 of 2 cores busy on
# average here, measured with tools/scripts/cpu_busy.sh), so the unit stage runs beside it on the
# CPU it leaves idle (tools/scripts/beside.sh: a session of its own whose scheduling group is niced
# to 19). The lane runs after the emulation stage, alone: its guest, emulated by qemu's TCG, was
# starved beside the two (CI runs M to O: its kernel tests took about 1,000 s instead of 290, and
# one run's controller in the guest missed the harness's 60 s wait for routes), and its remote tests
# build emulations on this machine's Open vSwitch as the emulation stage does. Every stage runs
# even when another failed; the unit stage's output is printed last; the run ends with one line
# per stage and fails if any stage failed or did not report.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${PYTEST:?}" "${UNIT_ARGS:?}" "${EMU_ARGS:?}" "${MAKE:=make}"
STAGES=.test-stages UNIT_LOG=.test-unit.log

stage() {   # stage NAME COMMAND...: run it, append "NAME rc=RC SECONDSs" to $STAGES
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    "$@"
    rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s" >> "$STAGES"
}

rm -f "$STAGES" "$UNIT_LOG"
# shellcheck disable=SC2086
stage unit tools/scripts/beside.sh $$ $PYTEST $UNIT_ARGS > "$UNIT_LOG" 2>&1 &
beside=$!
echo "== the unit stage runs beside the emulation stage on the CPU it leaves idle; its output follows the lane's"
# shellcheck disable=SC2086
stage emulation $PYTEST $EMU_ARGS
echo "== the full-kernel lane"
stage kernel "$MAKE" --no-print-directory test-kernel
wait "$beside"
echo "== the unit stage"; cat "$UNIT_LOG" 2>/dev/null
echo "== test stages"
failed=0
for s in unit emulation kernel; do
    if read -r name rc secs < <(grep "^$s " "$STAGES"); then
        echo "  $name: ${rc#rc=} ($secs)"
        [ "${rc#rc=}" = 0 ] || failed=1
    else
        echo "  $s: did not report"
        failed=1
    fi
done
rm -f "$STAGES" "$UNIT_LOG"
exit $failed
