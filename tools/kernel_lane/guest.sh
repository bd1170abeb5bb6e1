#!/bin/bash
# PID 1 of the full-kernel lane's guest (started by initramfs-init via switch_root).
# Sets up a minimal system, starts Open vSwitch on the kernel datapath, runs the lane's
# pytest selection with a hard time limit, writes the results to the output share and
# powers the VM off. Its console lines starting "hpnlab-lane:" are the host's progress.
#
# The checkout is shared read-only (/hpnlab/src-ro); /hpnlab/src is an overlay of it whose
# writes (bytecode) stay in guest memory. The project is importable through PYTHONPATH and
# the namespace hpnlab/{fabric,controller,cli} symlinked onto the checkout's folders, as setup.cfg maps them.
export PATH=/opt/hpnlab-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C.UTF-8 TERM=dumb
SRC=/hpnlab/src
OUT=/hpnlab/out
T0=$(cut -d' ' -f1 /proc/uptime)
say() { echo "hpnlab-lane: [$(cut -d' ' -f1 /proc/uptime)s] $*"; }

poweroff_now() {
    sync
    umount "$OUT" 2>/dev/null
    echo 1 > /proc/sys/kernel/sysrq
    echo o > /proc/sysrq-trigger
    sleep 5
    echo b > /proc/sysrq-trigger
}
finish() {   # finish RC WHY
    echo "$1" > "$OUT/rc.tmp" && mv "$OUT/rc.tmp" "$OUT/rc"
    say "done: rc=$1 $2"
    poweroff_now
}
trap 'finish 125 "guest runner interrupted"' TERM INT

mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts /dev/shm /run/lock
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ln -sf /proc/self/fd /dev/fd
dmesg -n 1                               # keep kernel chatter off the console
hostname hpnlab-kernel-lane
echo "127.0.1.1 hpnlab-kernel-lane" >> /etc/hosts
ip link set lo up
say "guest up (kernel $(uname -r), image $(cat /etc/hpnlab-lane-image 2>/dev/null))"

# Settings from the host (written before boot): LANE_TIMEOUT_S, LANE_TEST_TIMEOUT_S, LANE_PYTEST_ARGS.
LANE_TIMEOUT_S=900 LANE_TEST_TIMEOUT_S=420 LANE_PYTEST_ARGS="tests/kernel"
[ -f "$OUT/lane.env" ] && . "$OUT/lane.env"

# Open vSwitch on the kernel datapath: ovs-ctl loads the openvswitch module itself.
if ! /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random > "$OUT/ovs-start.log" 2>&1; then
    say "ovs-ctl start failed:"; tail -5 "$OUT/ovs-start.log"
fi
say "Open vSwitch: $(ovs-vsctl --timeout=10 get Open_vSwitch . ovs_version 2>&1), module: $(cat /sys/module/openvswitch/initstate 2>&1)"

# The project, importable without writing to the checkout.

mkdir -p /hpnlab/pylib/hpnlab
ln -s "$SRC/fabric" /hpnlab/pylib/hpnlab/fabric
ln -s "$SRC/controller" /hpnlab/pylib/hpnlab/controller
ln -s "$SRC/tools" /hpnlab/pylib/hpnlab/cli
export PYTHONPATH="/hpnlab/pylib" PYTHONUNBUFFERED=1
export HPNLAB_KERNEL_LANE=1
printf '#!/bin/sh\nexec /opt/hpnlab-venv/bin/python -m hpnlab.cli "$@"\n' > /usr/local/bin/hpnlab
chmod 755 /usr/local/bin/hpnlab

cd "$SRC" || finish 126 "no checkout"
say "pytest start (limit ${LANE_TIMEOUT_S}s, ${LANE_TEST_TIMEOUT_S}s per test): $LANE_PYTEST_ARGS"
# shellcheck disable=SC2086
timeout -k 15 "$LANE_TIMEOUT_S" python -m pytest -p no:cacheprovider -m kernel -v -rA --durations=15 \
    --timeout="$LANE_TEST_TIMEOUT_S" --junitxml="$OUT/junit.xml" $LANE_PYTEST_ARGS \
    > >(tee "$OUT/pytest.log") 2>&1
rc=$?
sleep 0.5   # let tee flush
[ $rc = 124 ] && say "pytest hit the lane's time limit (${LANE_TIMEOUT_S}s)"
finish "$rc" "(guest time $(cut -d' ' -f1 /proc/uptime)s)"
