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

# The second machine (LANE_MODE=server, tools/scripts/kernel_lane/second_machine.sh): the guest
# is a server the host's emulation places switches and hosts on. One virtio NIC joined to
# the host's tap (LANE_GUEST_CIDR, a /30: nothing but the host is reachable, there is no
# route beyond it), an sshd that takes only the run's key ($OUT/ssh/id.pub) with a host key
# made at this boot (its public half goes to $OUT/ssh/host_key.pub for the host's
# known_hosts), and the host's /run/hpnlab (9p tag hpnrun) at the same path, so the run
# directory's scripts are seen here. It serves until the host writes $OUT/stop or the
# lane's time limit passes.
# server_prepare runs in the background beside Open vSwitch's start (both take seconds under
# TCG and the guest has 2 vCPUs); serve_as_second_machine waits for it.
server_prepare() {
    modprobe virtio_net; modprobe tun
    local i=0 dev=""
    while [ -z "$dev" ] && [ $i -lt 50 ]; do
        dev=$(ls /sys/class/net | grep -v '^lo$\|^ovs-system$' | head -1); [ -z "$dev" ] && sleep 0.1; i=$((i+1))
    done
    [ -n "$dev" ] || finish 126 "no network device"
    ip addr add "$LANE_GUEST_CIDR" dev "$dev" && ip link set "$dev" up || finish 126 "cannot configure $dev"
    # the project for processes started over ssh (no PYTHONPATH there): a .pth in the venv
    # (the venv's site-packages found by name: a Python start costs seconds under TCG)
    local purelib
    purelib=$(ls -d /opt/hpnlab-venv/lib/python3*/site-packages | head -1)
    [ -d "$purelib" ] || finish 126 "no site-packages in /opt/hpnlab-venv"
    echo /hpnlab/pylib > "$purelib/hpnlab-lane.pth"
    ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key || finish 126 "ssh-keygen"
    sed -i 's/^root:![^:]*:/root:*:/' /etc/shadow      # a locked root is refused even with a key (UsePAM no)
    mkdir -p -m 700 /root/.ssh /run/sshd
    cp "$OUT/ssh/id.pub" /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys
    cat > /etc/ssh/sshd_config.d/hpnlab-lane.conf <<CONF
ListenAddress ${LANE_GUEST_CIDR%/*}
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PermitTunnel yes
MaxStartups 200
MaxSessions 200
SetEnv PATH=$PATH
CONF
    # -r: no re-exec of sshd per connection (an exec and a config and key load under TCG each)
    /usr/sbin/sshd -r -E "$OUT/sshd.log" || /usr/sbin/sshd -E "$OUT/sshd.log" || finish 126 "sshd did not start"
    cp /etc/ssh/ssh_host_ed25519_key.pub "$OUT/ssh/host_key.pub"
    say "second machine: $dev ${LANE_GUEST_CIDR}, sshd listening"
}
serve_as_second_machine() {
    wait "$PREP_PID" || finish 126 "preparing the second machine failed"
    # the host's run directories, mounted only now: the lane's own tests (run before, when
    # LANE_KERNEL_TESTS=1) keep their emulation state in the guest's /run/hpnlab
    mkdir -p /run/hpnlab
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 hpnrun /run/hpnlab || finish 126 "9p hpnrun"
    say "second machine up: ${LANE_GUEST_CIDR}, sshd, Open vSwitch $(ovs-vsctl --timeout=10 get Open_vSwitch . ovs_version 2>&1)"
    touch "$OUT/ready"
    local end=$(( $(cut -d. -f1 /proc/uptime) + LANE_TIMEOUT_S ))
    while [ ! -f "$OUT/stop" ] && [ "$(cut -d. -f1 /proc/uptime)" -lt $end ]; do sleep 1; done
    [ -f "$OUT/stop" ] || finish 124 "the host did not stop the second machine within ${LANE_TIMEOUT_S}s"
    finish 0 "second machine stopped by the host (guest time $(cut -d' ' -f1 /proc/uptime)s)"
}

# The lane's tests (LANE_PYTEST_ARGS, marked kernel) with the lane's time limits; returns pytest's rc.
run_lane_tests() {   # run_lane_tests LIMIT_S
    say "pytest start (limit ${1}s, ${LANE_TEST_TIMEOUT_S}s per test): $LANE_PYTEST_ARGS"
    # shellcheck disable=SC2086
    timeout -k 15 "$1" python -m pytest -p no:cacheprovider -m kernel -v -rA --durations=15 \
        --timeout="$LANE_TEST_TIMEOUT_S" --junitxml="$OUT/junit.xml" $LANE_PYTEST_ARGS \
        > >(tee "$OUT/pytest.log") 2>&1
    local rc=$?
    sleep 0.5   # let tee flush
    [ $rc = 124 ] && say "pytest hit the lane's time limit (${1}s)"
    return $rc
}

# Settings from the host (written before boot): LANE_TIMEOUT_S, LANE_TEST_TIMEOUT_S, LANE_PYTEST_ARGS,
# LANE_MODE (tests | server), LANE_GUEST_CIDR (server) and, in server mode, LANE_KERNEL_TESTS=1 with
# LANE_KERNEL_TIMEOUT_S: run the lane's tests first (rc to $OUT/kernel-rc), then serve (one boot
# for both parts of the lane: tools/scripts/kernel_lane/second_machine.sh --kernel-tests).
LANE_TIMEOUT_S=900 LANE_TEST_TIMEOUT_S=420 LANE_PYTEST_ARGS="tests/kernel" LANE_KERNEL_TESTS=0 LANE_KERNEL_TIMEOUT_S=900
[ -f "$OUT/lane.env" ] && . "$OUT/lane.env"

# The second machine's network and sshd come up beside Open vSwitch's start.
PREP_PID=""
if [ "${LANE_MODE:-tests}" = server ]; then
    server_prepare &
    PREP_PID=$!
fi
# Open vSwitch on the kernel datapath: ovs-ctl loads the openvswitch module itself.
if ! /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random > "$OUT/ovs-start.log" 2>&1; then
    say "ovs-ctl start failed:"; tail -5 "$OUT/ovs-start.log"
fi
say "Open vSwitch: $(ovs-vsctl --timeout=10 get Open_vSwitch . ovs_version 2>&1), module: $(cat /sys/module/openvswitch/initstate 2>&1)"

# The project, importable without writing to the checkout.

mkdir -p /hpnlab/pylib/hpnlab
ln -s "$SRC/fabric" /hpnlab/pylib/hpnlab/fabric
ln -s "$SRC/controller" /hpnlab/pylib/hpnlab/controller
ln -s "$SRC/cli" /hpnlab/pylib/hpnlab/cli
ln -s "$SRC/topologies" /hpnlab/pylib/hpnlab/topologies
export PYTHONPATH="/hpnlab/pylib" PYTHONUNBUFFERED=1
export HPNLAB_KERNEL_LANE=1
printf '#!/bin/sh\nexec /opt/hpnlab-venv/bin/python -m hpnlab.cli "$@"\n' > /usr/local/bin/hpnlab
chmod 755 /usr/local/bin/hpnlab

cd "$SRC" || finish 126 "no checkout"
if [ "${LANE_MODE:-tests}" = server ]; then
    if [ "$LANE_KERNEL_TESTS" = 1 ]; then
        run_lane_tests "$LANE_KERNEL_TIMEOUT_S"
        rc=$?
        echo "$rc" > "$OUT/kernel-rc.tmp" && mv "$OUT/kernel-rc.tmp" "$OUT/kernel-rc"
        say "lane tests done: rc=$rc (guest time $(cut -d' ' -f1 /proc/uptime)s); now the second machine"
    fi
    serve_as_second_machine   # does not return
fi
run_lane_tests "$LANE_TIMEOUT_S"
finish "$?" "(guest time $(cut -d' ' -f1 /proc/uptime)s)"
