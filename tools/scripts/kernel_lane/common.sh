# Shared settings of the full-kernel lane (sourced by build.sh and run.sh).
# Everything here can be overridden from the environment.

LANE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHECKOUT=$(cd "$LANE_DIR/../../.." && pwd)
# Machine-wide cache: CI runs in a fresh clone on the same machine, so a cache inside the
# checkout would be lost between runs.
LANE_CACHE=${HPNLAB_KERNEL_LANE_CACHE:-/var/cache/hpnlab/kernel-lane}
DEBIAN_SUITE=${HPNLAB_KERNEL_LANE_SUITE:-bookworm}
DEBIAN_MIRROR=${HPNLAB_KERNEL_LANE_MIRROR:-http://deb.debian.org/debian}
# Host tools the lane needs (apt package names).
LANE_HOST_PKGS="qemu-system-x86 debootstrap busybox-static e2fsprogs cpio gzip"
# Modules the initramfs loads to reach the root image and the 9p shares (dependencies
# are added from modules.dep).
INITRD_MODULES="virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p overlay"

lane_say() { echo "kernel lane: $*"; }
lane_die() { echo "kernel lane: $*" >&2; exit 1; }

# The Debian kernel package: the one linux-image-amd64 depends on (the generic flavour;
# the cloud flavour has no 9p).
lane_kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9.]+-[0-9]+-amd64$/ {print $2; exit}'
}

# One second-machine run at a time, and nothing a killed run left in the next one's way.
# lane_hold_link TAP [LOCKFILE] [WAIT_S]: take an exclusive flock on LOCKFILE (default
# /run/hpnlab/second-machine.lock; held on fd LANE_LOCK_FD until this shell exits), waiting up to
# WAIT_S seconds (default $HPNLAB_SECOND_MACHINE_WAIT or 1800) while another run holds it. Holding
# the lock, a TAP that still exists is a leftover of a run that was killed before its cleanup
# (SIGKILL, a machine stop): it is removed, saying so, and so are that run's directories but the
# newest three (their console logs; LANE_RUN_PREFIX, default /tmp/hpnlab-second-machine.). Exit 1 with one line if the lock is not had in time.
lane_hold_link() {
    local tap=$1 lock=${2:-/run/hpnlab/second-machine.lock} wait_s=${3:-${HPNLAB_SECOND_MACHINE_WAIT:-1800}}
    mkdir -p "$(dirname "$lock")" || lane_die "cannot create $(dirname "$lock")"
    exec {LANE_LOCK_FD}>>"$lock" || lane_die "cannot open $lock"
    if ! flock -n "$LANE_LOCK_FD"; then
        echo "second machine: another run holds $lock (pid $(head -c 20 "$lock" 2>/dev/null | tr -dc 0-9)); waiting up to ${wait_s}s"
        flock -w "$wait_s" "$LANE_LOCK_FD" || lane_die "another second-machine run still holds $lock after ${wait_s}s"
    fi
    echo $$ > "$lock"
    if [ -e "/sys/class/net/$tap" ]; then
        echo "second machine: removing $tap, left by a run that was killed before its cleanup"
        ip link del "$tap" || lane_die "cannot remove the leftover $tap"
    fi
    # shellcheck disable=SC2012
    ls -1dt "${LANE_RUN_PREFIX:-/tmp/hpnlab-second-machine.}"* 2>/dev/null | tail -n +4 | while IFS= read -r old; do
        rm -rf -- "$old"
    done
}
