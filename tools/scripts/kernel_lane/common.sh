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
