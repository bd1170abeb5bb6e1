#!/usr/bin/env bash
# make test's three stages, each in its folder of tests/: unit (pure, no root), emulation (root,
# real Open vSwitch, Mininet, controller processes) and the full-kernel lane (a stock Debian
# kernel under qemu: its own tests, tests/kernel, then tests/remote with its guest as the second
# machine). Called by `make test` with PYTEST, UNIT_ARGS, EMU_ARGS and MAKE set.
#
# The emulation stage mostly waits (on links, timers and processes: 0.86 of 2 cores busy on
# average here, measured with tools/scripts/cpu_busy.sh), so the lane and the unit stage run
# beside it on the CPU it leaves idle (tools/scripts/beside.sh: a session of their own whose
# scheduling group is niced to 19). Within that session the lane comes first (the unit stage is
# niced again): its guest is the longer path, since tests/remote build emulations on this
# machine's Open vSwitch too and so start only once the emulation stage is over. Every stage runs
# even when another failed; the unit stage's and the lane's output are printed after the emulation
# stage's; the run ends with one line per stage and fails if any stage failed or did not report.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${PYTEST:?}" "${UNIT_ARGS:?}" "${EMU_ARGS:?}" "${MAKE:=make}"
STAGES=.test-stages DONE=.test-emulation-done UNIT_LOG=.test-unit.log LANE_LOG=.test-lane.log

stage() {   # stage NAME COMMAND...: run it, append "NAME rc=RC SECONDSs" to $STAGES
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    "$@"
    rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s" >> "$STAGES"
}

if [ "${1:-}" = --beside ]; then
    # in beside.sh's session: the unit stage at nice 19 within it, the lane ahead of it. The lane's
    # guest gets only idle CPU here: its time limits are widened to match, and its remote tests
    # wait for the emulation stage to end.
    # shellcheck disable=SC2086
    stage unit nice -n 19 $PYTEST $UNIT_ARGS > "$UNIT_LOG" 2>&1 &
    HPNLAB_KERNEL_LANE_TIMEOUT=${HPNLAB_KERNEL_LANE_TIMEOUT:-1800} \
    HPNLAB_KERNEL_LANE_TEST_TIMEOUT=${HPNLAB_KERNEL_LANE_TEST_TIMEOUT:-900} \
    HPNLAB_SECOND_MACHINE_TIMEOUT=${HPNLAB_SECOND_MACHINE_TIMEOUT:-3600} \
    HPNLAB_SECOND_MACHINE_AFTER="$PWD/$DONE" \
        stage kernel "$MAKE" --no-print-directory test-kernel > "$LANE_LOG" 2>&1
    wait
    exit 0
fi

rm -f "$STAGES" "$DONE" "$UNIT_LOG" "$LANE_LOG"
tools/scripts/beside.sh $$ "$0" --beside &
beside=$!
echo "== the full-kernel lane and the unit stage run beside the emulation stage on the CPU it leaves idle; their output follows"
# shellcheck disable=SC2086
stage emulation $PYTEST $EMU_ARGS
touch "$DONE"
wait "$beside"
echo "== the unit stage"; cat "$UNIT_LOG" 2>/dev/null
echo "== the full-kernel lane"; cat "$LANE_LOG" 2>/dev/null
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
rm -f "$STAGES" "$DONE" "$UNIT_LOG" "$LANE_LOG"
exit $failed
