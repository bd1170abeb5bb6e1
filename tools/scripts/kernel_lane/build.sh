#!/usr/bin/env bash
# Build (or reuse) what the full-kernel lane boots: a stock Debian kernel, a busybox
# initramfs and a debootstrap root image with the project's dependencies.
#
#   tools/scripts/kernel_lane/build.sh        prints the image directory on its last line
#
# The result lives in $LANE_CACHE/images/<key>, where <key> hashes the kernel package
# version, packages.txt, the Python requirements from setup.cfg and this builder, so a
# change to any of them builds a new image. Nothing is installed on the host except the
# lane's own tools (qemu, debootstrap, busybox-static); the kernel is unpacked, never
# installed. Exit code 3 means "cannot build here for a reason outside the project".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
lane_say() { echo "kernel lane: $*" >&2; }   # stdout carries only the image directory

unavailable() { echo "kernel lane: $*" >&2; exit 3; }

[ "$(id -u)" = 0 ] || unavailable "needs root (debootstrap, chroot); run 'sudo make test-kernel'"

# --- host tools ------------------------------------------------------------------------
missing=""
for p in $LANE_HOST_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    lane_say "installing host tools:$missing"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1; } \
        || unavailable "could not install$missing with apt"
fi

mkdir -p "$LANE_CACHE"
exec 9>"$LANE_CACHE/.build.lock"
flock 9   # one builder at a time on this machine; others wait and then reuse its result

# --- kernel ----------------------------------------------------------------------------
KPKG=$(lane_kernel_pkg)
if [ -z "$KPKG" ]; then
    apt-get update -qq || true
    KPKG=$(lane_kernel_pkg)
fi
[ -n "$KPKG" ] || unavailable "apt knows no linux-image-amd64 (is a Debian archive configured?)"
KVERSION=$(apt-cache show "$KPKG" | awk '/^Version:/ {print $2; exit}')
KDIR="$LANE_CACHE/kernel/$KPKG-$KVERSION"
if [ ! -f "$KDIR/READY" ]; then
    lane_say "fetching $KPKG $KVERSION (unpacked, not installed)"
    rm -rf "$KDIR" "$KDIR.tmp"; mkdir -p "$KDIR.tmp/deb"
    (cd "$KDIR.tmp/deb" && apt-get download -q "$KPKG" >/dev/null 2>&1) \
        || unavailable "apt-get download $KPKG failed"
    dpkg-deb -x "$KDIR.tmp"/deb/*.deb "$KDIR.tmp/root"
    rm -rf "$KDIR.tmp/deb"
    KVER=$(ls "$KDIR.tmp/root/lib/modules")
    depmod -b "$KDIR.tmp/root" "$KVER"
    echo "$KVER" > "$KDIR.tmp/kver"
    touch "$KDIR.tmp/READY"
    mv "$KDIR.tmp" "$KDIR"
fi
KVER=$(cat "$KDIR/kver")
KMOD="$KDIR/root/lib/modules/$KVER"

# --- image key -------------------------------------------------------------------------
KEY=$( {
    echo "kernel $KPKG $KVERSION suite $DEBIAN_SUITE"
    grep -v '^#' "$LANE_DIR/packages.txt"
    /usr/bin/env python3 "$LANE_DIR/pydeps.py" "$CHECKOUT/setup.cfg"
    cat "$LANE_DIR/build.sh" "$LANE_DIR/common.sh" "$LANE_DIR/initramfs-init"
} | sha256sum | cut -c1-16)
IMG="$LANE_CACHE/images/$KEY"
if [ -f "$IMG/READY" ]; then
    lane_say "image $KEY cached ($IMG)"
    echo "$IMG"; exit 0
fi
start=$(date +%s)
lane_say "building image $KEY (cold cache: a few minutes)"
# Never rm -rf a tree that still has something mounted in it (a killed earlier build).
if grep -q " $IMG.tmp/" /proc/mounts; then
    lane_die "$IMG.tmp still has mounts from an interrupted build; unmount them first"
fi
rm -rf "$IMG.tmp"; mkdir -p "$IMG.tmp"
WORK="$IMG.tmp"
cp "$KDIR/root/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
echo "$KVER" > "$WORK/kver"

# --- initramfs: busybox + the modules to reach the root image and the shares ----------
IR="$WORK/initramfs"
mkdir -p "$IR"/{bin,dev,proc,sys,lower,upper,newroot,lib/modules}
cp /bin/busybox "$IR/bin/busybox"
cp "$LANE_DIR/initramfs-init" "$IR/init"; chmod 755 "$IR/init"
declare -A seen=()
order=()
add_module() {   # depth-first over modules.dep: dependencies before the module
    local name=$1 line path dep
    line=$(grep -E "(^|/)${name}\.ko(\.[a-z]+)?:" "$KMOD/modules.dep" | head -1) \
        || lane_die "module $name not in $KPKG"
    path=${line%%:*}
    [ -n "${seen[$path]:-}" ] && return 0
    seen[$path]=1
    for dep in ${line#*:}; do add_module "$(basename "${dep%%.ko*}")"; done
    order+=("$path")
}
for m in $INITRD_MODULES; do add_module "$m"; done
for p in "${order[@]}"; do
    cp "$KMOD/$p" "$IR/lib/modules/"
    basename "$p" >> "$IR/lib/modules/load-order"
done
(cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/initrd.img"
rm -rf "$IR"

# --- root filesystem -------------------------------------------------------------------
ROOT="$WORK/root"
lane_say "debootstrap $DEBIAN_SUITE (minbase)"
debootstrap --variant=minbase "$DEBIAN_SUITE" "$ROOT" "$DEBIAN_MIRROR" > "$WORK/debootstrap.log" 2>&1 \
    || { tail -5 "$WORK/debootstrap.log" >&2; unavailable "debootstrap from $DEBIAN_MIRROR failed"; }

mounted=()
cleanup_mounts() {
    local i
    for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup_mounts EXIT
for fs in proc sys dev; do
    mount --bind "/$fs" "$ROOT/$fs"; mounted+=("$ROOT/$fs")
done
mkdir -p "$LANE_CACHE/pip-cache" "$ROOT/root/.cache/pip"
mount --bind "$LANE_CACHE/pip-cache" "$ROOT/root/.cache/pip"; mounted+=("$ROOT/root/.cache/pip")
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod 755 "$ROOT/usr/sbin/policy-rc.d"

# pip in the image trusts what the host trusts (a site may intercept TLS with its own CA)
# and uses the host's index settings from the environment, if any.
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/tmp/host-ca.crt" 2>/dev/null || true
pip_env=(PIP_CERT=/tmp/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=120)
for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST http_proxy https_proxy no_proxy; do
    [ -n "${!v:-}" ] && pip_env+=("$v=${!v}")
done
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "${pip_env[@]}" "$@"; }
PKGS=$(grep -v '^#' "$LANE_DIR/packages.txt" | xargs)
lane_say "apt in the image: $PKGS"
in_root apt-get install -y -q --no-install-recommends $PKGS > "$WORK/apt.log" 2>&1 \
    || { tail -20 "$WORK/apt.log" >&2; unavailable "apt-get install in the image failed"; }

lane_say "python venv in the image: $(/usr/bin/env python3 "$LANE_DIR/pydeps.py" "$CHECKOUT/setup.cfg" | xargs)"
/usr/bin/env python3 "$LANE_DIR/pydeps.py" "$CHECKOUT/setup.cfg" > "$ROOT/tmp/requirements.txt"
in_root python3 -m venv /opt/hpnlab-venv
in_root /opt/hpnlab-venv/bin/pip install -q --disable-pip-version-check -r /tmp/requirements.txt \
    > "$WORK/pip.log" 2>&1 \
    || { tail -20 "$WORK/pip.log" >&2; unavailable "pip install in the image failed"; }
cleanup_mounts; mounted=(); trap - EXIT

# The kernel's modules (openvswitch, sch_netem, sch_red, ...), loaded on demand in the guest.
mkdir -p "$ROOT/lib/modules"
cp -a "$KMOD" "$ROOT/lib/modules/$KVER"
rm -f "$ROOT/lib/modules/$KVER/build" "$ROOT/lib/modules/$KVER/source"
# Trim what the guest never needs.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT/tmp/requirements.txt" "$ROOT/tmp/host-ca.crt" \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/*
rm -f "$ROOT/usr/sbin/policy-rc.d"
# No ssh host key in the cached image: the guest makes its own at every boot (second machine).
rm -f "$ROOT"/etc/ssh/ssh_host_*
echo "hpnlab-kernel-lane" > "$ROOT/etc/hostname"
echo "$KEY" > "$ROOT/etc/hpnlab-lane-image"

lane_say "writing the root image"
size_mb=$(( $(du -sm "$ROOT" | cut -f1) * 12 / 10 + 200 ))
mkfs.ext4 -q -F -L hpnlab-root -d "$ROOT" "$WORK/root.img" "${size_mb}M" > "$WORK/mkfs.log" 2>&1 \
    || { cat "$WORK/mkfs.log" >&2; lane_die "mkfs.ext4 failed"; }
rm -rf "$ROOT"
touch "$WORK/READY"
mv "$WORK" "$IMG"
# Keep the cache small: drop images of older keys (only ones this builder made).
for old in "$LANE_CACHE"/images/*; do
    [ "$old" = "$IMG" ] || [ ! -d "$old" ] || grep -q " $old/" /proc/mounts || rm -rf "$old"
done
lane_say "image $KEY built in $(( $(date +%s) - start )) s"
echo "$IMG"
