#!/usr/bin/env bash
# The full-kernel lane: boot a stock Debian kernel under qemu (software emulation, TCG)
# with the project's own root image, run the tests marked `kernel` inside it, bring back
# pass/fail and the pytest output.
#
#   sudo tools/scripts/kernel_lane/run.sh [PYTEST ARGS...]      (default: tests/kernel)
#
# Environment: HPNLAB_KERNEL_LANE_TIMEOUT (s, whole pytest run in the guest, default 900),
# HPNLAB_KERNEL_LANE_TEST_TIMEOUT (s per test incl. its fixtures, default 420), HPNLAB_KERNEL_LANE_CACHE,
# HPNLAB_KERNEL_LANE_BOOT_TIMEOUT (s until the guest's first line, default 120),
# HPNLAB_KERNEL_LANE=skip (skip the lane, saying so).
# Exit: 0 tests passed, or the lane was skipped for a reason outside the project (one
# line "kernel lane: SKIPPED: <why>"); 1 the tests failed or the guest broke.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

skip() { echo "kernel lane: SKIPPED: $*"; exit 0; }
[ "${HPNLAB_KERNEL_LANE:-}" = skip ] && skip "HPNLAB_KERNEL_LANE=skip"
[ "$(uname -m)" = x86_64 ] || skip "needs an x86_64 host (this is $(uname -m))"
mem_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
[ "${mem_kb:-0}" -ge $((5 * 1024 * 1024)) ] || skip "needs 5 GiB of free memory for a 4 GiB guest (have $((mem_kb / 1024)) MiB)"

t_start=$(date +%s)
IMG=$("$LANE_DIR/build.sh" | tail -1)
case ${PIPESTATUS[0]} in
    0) ;;
    3) skip "could not build the guest (see the line above)";;
    *) lane_die "building the guest image failed";;
esac
t_built=$(date +%s)

GUEST_TIMEOUT=${HPNLAB_KERNEL_LANE_TIMEOUT:-900}
TEST_TIMEOUT=${HPNLAB_KERNEL_LANE_TEST_TIMEOUT:-420}
QEMU=${HPNLAB_KERNEL_LANE_QEMU:-qemu-system-x86_64}
BOOT_TIMEOUT=${HPNLAB_KERNEL_LANE_BOOT_TIMEOUT:-120}    # qemu start to the guest runner
HOST_TIMEOUT=$((GUEST_TIMEOUT + BOOT_TIMEOUT + 60))     # hard stop for qemu itself

# Keep the five newest earlier run directories (console + pytest output), drop older ones.
ls -dt /tmp/hpnlab-kernel-lane.?????? 2>/dev/null | tail -n +6 | xargs -r rm -rf --
RUN=$(mktemp -d /tmp/hpnlab-kernel-lane.XXXXXX)
OUT="$RUN/out"; mkdir -p "$OUT"
{
    printf 'LANE_TIMEOUT_S=%q\nLANE_TEST_TIMEOUT_S=%q\n' "$GUEST_TIMEOUT" "$TEST_TIMEOUT"
    printf 'LANE_PYTEST_ARGS=%q\n' "${*:-tests/kernel}"
} > "$OUT/lane.env"
CONSOLE="$RUN/console.log"; : > "$CONSOLE"

lane_say "booting $(cat "$IMG/kver") under qemu (TCG, 2 vCPUs, 4 GiB); run dir $RUN"
timeout -k 10 "$HOST_TIMEOUT" "$QEMU" \
    -accel tcg,thread=multi -cpu max -m 4G -smp 2 \
    -display none -monitor none -serial "file:$CONSOLE" -no-reboot -nic none \
    -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img" \
    -append "console=ttyS0 panic=-1" \
    -drive "file=$IMG/root.img,if=virtio,format=raw,readonly=on" \
    -virtfs "local,path=$CHECKOUT,mount_tag=hpnsrc,security_model=none,readonly=on" \
    -virtfs "local,path=$OUT,mount_tag=hpnout,security_model=none" \
    > "$RUN/qemu.log" 2>&1 &
QPID=$!
# Show the guest's progress, and everything from pytest once it starts.
(on=0; tail -n +1 -F --pid="$QPID" "$CONSOLE" 2>/dev/null | while IFS= read -r line; do
     line=${line%$'\r'}
     case $line in
         hpnlab-lane:*pytest\ start*) on=1; echo "  $line";;
         hpnlab-lane:*) echo "  $line";;
         *) [ $on = 1 ] && echo "  | $line";;
     esac
 done) &
TPID=$!
# If the kernel has not printed anything by BOOT_TIMEOUT, qemu cannot boot it here.
(for _ in $(seq "$BOOT_TIMEOUT"); do
     sleep 1; kill -0 "$QPID" 2>/dev/null || exit 0; grep -q "hpnlab-lane:" "$CONSOLE" && exit 0
 done; touch "$RUN/no-boot"; kill "$QPID") >/dev/null 2>&1 &
WPID=$!
wait "$QPID"; qrc=$?
kill "$WPID" 2>/dev/null; wait "$TPID" 2>/dev/null
t_end=$(date +%s)

timing="build/cache $((t_built - t_start)) s, boot+tests $((t_end - t_built)) s, total $((t_end - t_start)) s"
if [ -f "$OUT/rc" ]; then
    rc=$(cat "$OUT/rc")
    if [ "$rc" = 0 ]; then
        lane_say "PASSED ($timing); output in $RUN"
        exit 0
    fi
    [ "$rc" = 5 ] && lane_say "no tests were collected"
    lane_say "FAILED (pytest rc=$rc; $timing); pytest output $OUT/pytest.log, console $CONSOLE"
    exit 1
fi
# No result from the guest: decide whether qemu could not boot the kernel at all (outside
# the project: skip) or the project's boot path broke (fail).
if ! grep -q "Linux version\|hpnlab-lane:\|Run /init" "$CONSOLE"; then
    reason=$(tail -1 "$RUN/qemu.log" 2>/dev/null)
    [ -f "$RUN/no-boot" ] && reason="the kernel printed nothing within ${BOOT_TIMEOUT} s"
    skip "qemu could not boot the Debian kernel on this machine (qemu exit $qrc${reason:+: $reason})"
fi
lane_say "FAILED: the guest gave no result (qemu exit $qrc; $timing). Last console lines:"
tail -25 "$CONSOLE" | sed 's/^/  > /'
exit 1
