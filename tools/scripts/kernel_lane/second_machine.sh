#!/usr/bin/env bash
# The second machine (issue 16, part 8): the full-kernel lane's guest booted as a server
# that this machine's emulation places one plane's switches (and half of the hosts) on,
# reached by ssh over a private link; then the tests in tests/remote run HERE, against it.
#
#   sudo tools/scripts/kernel_lane/second_machine.sh [PYTEST ARGS...]    (default: tests/remote)
#   sudo tools/scripts/kernel_lane/second_machine.sh --serve             boot it and wait (Ctrl-C ends it)
#   sudo tools/scripts/kernel_lane/second_machine.sh --kernel-tests "tests/kernel" [PYTEST ARGS...]
#        the whole lane on ONE boot: the guest runs the lane's own tests (as run.sh does) first,
#        then serves as the second machine (saves a boot); where the second machine cannot run
#        here, the two parts run as before (run.sh, then this script).
#
# One run at a time: a second run waits for the first (an flock on /run/hpnlab/second-machine.lock,
# HPNLAB_SECOND_MACHINE_WAIT s at most, default 1800); the tap a killed run left is removed.
# What it makes, and removes on every exit: a tap device (hpnlab-sm0) with 169.254.77.1/30,
# the guest's NIC on its other end with 169.254.77.2/30 (no route beyond the /30 on either
# side: nothing but the two machines is reachable), an ed25519 key made for this run (the
# guest's sshd takes only it), a known_hosts file with the host key the guest made at boot,
# and the qemu process (ended by its pid). The guest sees the checkout read-only and this
# machine's /run/hpnlab (the emulation's run directories) at the same path.
# Environment: HPNLAB_SECOND_MACHINE_TIMEOUT (s the guest serves at most, default 900),
# HPNLAB_KERNEL_LANE_BOOT_TIMEOUT (s until sshd is up, default 240), HPNLAB_KERNEL_LANE=skip,
# HPNLAB_SECOND_MACHINE_PROFILE=1 (before the tests, time what every guest-side step is made
# of: a new ssh connection, a command on it, a rank's Python start).
# With --kernel-tests also HPNLAB_KERNEL_LANE_TIMEOUT and HPNLAB_KERNEL_LANE_TEST_TIMEOUT (as run.sh).
# Exit: 0 passed or skipped with one line "second machine: SKIPPED: <why>"; 1 failed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

say() { echo "second machine: $*"; }
skip() { say "SKIPPED: $*"; exit 0; }
KERNEL_ARGS=""
if [ "${1:-}" = --kernel-tests ]; then
    KERNEL_ARGS=${2:?--kernel-tests needs the lane tests to run}
    shift 2
    # the combined guest needs what the second machine needs, and run.sh's 4 GiB: otherwise,
    # (or when the lane is skipped) the two parts run separately, each saying why it skips
    why=""
    [ "${HPNLAB_KERNEL_LANE:-}" = skip ] && why="HPNLAB_KERNEL_LANE=skip"
    [ "$(uname -m)" = x86_64 ] || why="not an x86_64 host"
    [ -e /dev/net/tun ] || why="no /dev/net/tun"
    command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || why="no ssh client"
    [ "$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)" -ge $((5 * 1024 * 1024)) ] || why="less than 5 GiB free"
    if [ -n "$why" ]; then
        [ "${HPNLAB_KERNEL_LANE:-}" = skip ] || say "one boot for both parts of the lane is not possible ($why): two boots"
        # shellcheck disable=SC2086
        "$LANE_DIR/run.sh" $KERNEL_ARGS; rc=$?
        "${BASH_SOURCE[0]}" "$@" || rc=1
        exit $(( rc != 0 ))
    fi
fi
[ "${HPNLAB_KERNEL_LANE:-}" = skip ] && skip "HPNLAB_KERNEL_LANE=skip"
[ "$(uname -m)" = x86_64 ] || skip "needs an x86_64 host (this is $(uname -m))"
[ -e /dev/net/tun ] || skip "no /dev/net/tun on this machine (the link to the guest is a tap device)"
mem_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
[ "${mem_kb:-0}" -ge $((3 * 1024 * 1024)) ] || skip "needs 3 GiB of free memory for a 2 GiB guest (have $((mem_kb / 1024)) MiB)"
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || skip "no ssh client on this machine (apt install openssh-client)"
PYTEST=${HPNLAB_PYTEST:-$CHECKOUT/.venv/bin/pytest}
SERVE=0; [ "${1:-}" = --serve ] && { SERVE=1; shift; }
[ $SERVE = 1 ] || [ -x "$PYTEST" ] || lane_die "no $PYTEST (make venv first)"

TAP=${HPNLAB_SECOND_MACHINE_TAP:-hpnlab-sm0}
HOST_IP=169.254.77.1
GUEST_IP=169.254.77.2
# one run at a time (a second waits for the first); a tap a killed run left is removed
lane_hold_link "$TAP"

IMG=$("$LANE_DIR/build.sh" | tail -1)
case ${PIPESTATUS[0]} in
    0) ;;
    3) skip "could not build the guest (see the line above)";;
    *) lane_die "building the guest image failed";;
esac

GUEST_TIMEOUT=${HPNLAB_SECOND_MACHINE_TIMEOUT:-900}
BOOT_TIMEOUT=${HPNLAB_KERNEL_LANE_BOOT_TIMEOUT:-240}
MEM=2G KERNEL_TIMEOUT=0
if [ -n "$KERNEL_ARGS" ]; then
    MEM=4G     # the lane's tests need run.sh's guest
    KERNEL_TIMEOUT=${HPNLAB_KERNEL_LANE_TIMEOUT:-900}
fi
QEMU=${HPNLAB_KERNEL_LANE_QEMU:-qemu-system-x86_64}
# TCG, as the lane: /dev/kvm opens here but a KVM guest (-cpu qemu64; -cpu host aborts on
# MSR 0x10a) printed nothing in 150 s (no vmx/svm for nested guests on this machine).
ACCEL=(-accel tcg,thread=multi -cpu max)
RUN=$(mktemp -d /tmp/hpnlab-second-machine.XXXXXX)
OUT="$RUN/out"; mkdir -p "$OUT/ssh" /run/hpnlab
QPID=""
MADE_TAP=""     # set once this run created the tap: only then does cleanup remove it
cleanup() {
    touch "$OUT/stop" 2>/dev/null
    if [ -n "$QPID" ]; then
        for _ in $(seq 10); do kill -0 "$QPID" 2>/dev/null || break; sleep 1; done
        kill "$QPID" 2>/dev/null; wait "$QPID" 2>/dev/null
    fi
    [ -n "$MADE_TAP" ] && ip link del "$TAP" 2>/dev/null
    rm -f "$RUN/ssh-id" "$RUN/ssh-id.pub"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# the link: a tap device this script creates (and removes in cleanup)
ip tuntap add dev "$TAP" mode tap || lane_die "cannot create the tap device $TAP (is another run using it?)"
MADE_TAP=1
ip addr add "$HOST_IP/30" dev "$TAP" && ip link set "$TAP" up || lane_die "cannot configure $TAP"
ssh-keygen -q -t ed25519 -N '' -C "hpnlab second machine $(basename "$RUN")" -f "$RUN/ssh-id" || lane_die "ssh-keygen failed"
cp "$RUN/ssh-id.pub" "$OUT/ssh/id.pub"
{
    printf 'LANE_MODE=server\nLANE_TIMEOUT_S=%q\nLANE_GUEST_CIDR=%q\n' "$GUEST_TIMEOUT" "$GUEST_IP/30"
    if [ -n "$KERNEL_ARGS" ]; then
        printf 'LANE_KERNEL_TESTS=1\nLANE_KERNEL_TIMEOUT_S=%q\nLANE_TEST_TIMEOUT_S=%q\nLANE_PYTEST_ARGS=%q\n' \
            "$KERNEL_TIMEOUT" "${HPNLAB_KERNEL_LANE_TEST_TIMEOUT:-420}" "$KERNEL_ARGS"
    fi
} > "$OUT/lane.env"
CONSOLE="$RUN/console.log"; : > "$CONSOLE"
t0=$(date +%s)
say "booting $(cat "$IMG/kver") under qemu (${ACCEL[1]}, 2 vCPUs, ${MEM}iB) on $TAP ($HOST_IP <-> $GUEST_IP); run dir $RUN"
timeout -k 10 $((GUEST_TIMEOUT + KERNEL_TIMEOUT + BOOT_TIMEOUT + 60)) "$QEMU" \
    "${ACCEL[@]}" -m "$MEM" -smp 2 \
    -display none -monitor none -serial "file:$CONSOLE" -no-reboot \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" -device virtio-net-pci,netdev=n0 \
    -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img" \
    -append "console=ttyS0 panic=-1 quiet" \
    -drive "file=$IMG/root.img,if=virtio,format=raw,readonly=on" \
    -virtfs "local,path=$CHECKOUT,mount_tag=hpnsrc,security_model=none,readonly=on" \
    -virtfs "local,path=$OUT,mount_tag=hpnout,security_model=none" \
    -virtfs "local,path=/run/hpnlab,mount_tag=hpnrun,security_model=none" \
    > "$RUN/qemu.log" 2>&1 &
QPID=$!
if [ -n "$KERNEL_ARGS" ]; then
    # the lane's tests first: their progress and pytest's output, as run.sh shows them
    (on=0; tail -n +1 -F --pid="$QPID" "$CONSOLE" 2>/dev/null | while IFS= read -r line; do
         line=${line%$'\r'}
         case $line in
             hpnlab-lane:*pytest\ start*) on=1; echo "  $line";;
             hpnlab-lane:*lane\ tests\ done*) on=0; echo "  $line";;
             hpnlab-lane:*) echo "  $line";;
             *) [ $on = 1 ] && echo "  | $line";;
         esac
         [ -f "$OUT/kernel-rc" ] && [ $on = 0 ] && break
     done) &
    TPID=$!
    t_tests=$(date +%s)
    for _ in $(seq $((BOOT_TIMEOUT + KERNEL_TIMEOUT + 30))); do
        [ -f "$OUT/kernel-rc" ] && break
        kill -0 "$QPID" 2>/dev/null || break
        if [ $(( $(date +%s) - t_tests )) -ge "$BOOT_TIMEOUT" ] && ! grep -q "Linux version\|hpnlab-lane:" "$CONSOLE"; then
            break
        fi
        sleep 1
    done
    kill "$TPID" 2>/dev/null; wait "$TPID" 2>/dev/null
    if ! grep -q "Linux version\|hpnlab-lane:" "$CONSOLE"; then
        lane_say "SKIPPED: qemu could not boot the Debian kernel on this machine ($(tail -1 "$RUN/qemu.log"))"
        skip "qemu could not boot the Debian kernel on this machine"
    fi
    KERNEL_RC=$(cat "$OUT/kernel-rc" 2>/dev/null || echo none)
    case $KERNEL_RC in
        0) lane_say "PASSED (boot+tests $(( $(date +%s) - t0 )) s); pytest output $OUT/pytest.log";;
        none) lane_say "FAILED: the guest gave no result of the lane's tests. Last console lines:"
              tail -25 "$CONSOLE" | sed 's/^/  > /';;
        5) lane_say "no tests were collected"; lane_say "FAILED (pytest rc=5); pytest output $OUT/pytest.log";;
        *) lane_say "FAILED (pytest rc=$KERNEL_RC); pytest output $OUT/pytest.log, console $CONSOLE";;
    esac
fi
for _ in $(seq "$BOOT_TIMEOUT"); do
    [ -f "$OUT/ready" ] && break
    kill -0 "$QPID" 2>/dev/null || break
    sleep 1
done
if [ ! -f "$OUT/ready" ]; then
    if ! grep -q "Linux version\|hpnlab-lane:" "$CONSOLE"; then
        skip "qemu could not boot the Debian kernel on this machine ($(tail -1 "$RUN/qemu.log"))"
    fi
    say "FAILED: the guest did not come up as a server within ${BOOT_TIMEOUT}s. Last console lines:"
    tail -15 "$CONSOLE" | sed 's/^/  > /'
    exit 1
fi
grep "hpnlab-lane:" "$CONSOLE" | sed 's/^/  /'
echo "$GUEST_IP $(cut -d' ' -f1,2 "$OUT/ssh/host_key.pub")" > "$RUN/known_hosts"
say "up in $(( $(date +%s) - t0 )) s"

export HPNLAB_SECOND_MACHINE="$GUEST_IP" HPNLAB_SSH_IDENTITY="$RUN/ssh-id" HPNLAB_SSH_KNOWN_HOSTS="$RUN/known_hosts" \
       HPNLAB_REMOTE_PYTHON=/opt/hpnlab-venv/bin/python HPNLAB_SECOND_MACHINE_CONTROLLER_IP="$HOST_IP"
if [ "${HPNLAB_SECOND_MACHINE_PROFILE:-}" = 1 ]; then
    SSH=(ssh -q -o BatchMode=yes -o IdentitiesOnly=yes -i "$RUN/ssh-id" -o UserKnownHostsFile="$RUN/known_hosts"
         -o StrictHostKeyChecking=yes -o ControlMaster=no -o ControlPath=none "root@$GUEST_IP")
    since() { echo "$(date +%s.%N) $1" | awk '{printf "%.2f", $1 - $2}'; }
    p0=$(date +%s.%N); "${SSH[@]}" true; t_conn=$(since "$p0")
    p0=$(date +%s.%N); "${SSH[@]}" 'for i in 1 2 3 4 5; do ip link show lo >/dev/null; done'; t_cmd=$(since "$p0")
    p0=$(date +%s.%N); "${SSH[@]}" "$HPNLAB_REMOTE_PYTHON -c 'import hpnlab.fabric.transport.ranks'"; t_py=$(since "$p0")
    p0=$(date +%s.%N); "${SSH[@]}" "$HPNLAB_REMOTE_PYTHON -c 'import hpnlab.fabric.transport.ranks'"; t_py="$t_py then $(since "$p0")"
    say "profile: new ssh connection + true ${t_conn} s; one connection + 5 ip commands ${t_cmd} s;" \
        "one connection + a rank's imports (python, numpy, hpnlab.fabric.transport.ranks) ${t_py} s; load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
if [ $SERVE = 1 ]; then
    say "serving; ssh -i $RUN/ssh-id -o UserKnownHostsFile=$RUN/known_hosts root@$GUEST_IP  (Ctrl-C ends it)"
    env | grep -E '^HPNLAB_(SECOND|SSH|REMOTE)' | sed 's/^/  export /'
    wait "$QPID"
    exit 0
fi
cd "$CHECKOUT" || lane_die "no checkout"
"$PYTEST" -p no:cacheprovider -m kernel -v -rA --durations=5 "${@:-tests/remote}"
rc=$?
say "pytest rc=$rc in $(( $(date +%s) - t0 )) s in all (console $CONSOLE)"
[ -n "$KERNEL_ARGS" ] && [ "$KERNEL_RC" != 0 ] && exit 1
[ $rc = 0 ] && exit 0
exit 1
