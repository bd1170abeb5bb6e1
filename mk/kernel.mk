# The full-kernel lane (issue 6): a stock Debian kernel under qemu runs the tests marked
# `kernel` (OVS kernel datapath, netem, RED/ECN), which this machine's kernel cannot.
# Called by `make test-kernel` (and so by `make test` and .ci/run).
#
#   sudo make test-kernel                         the lane (tests/kernel, then tests/remote: one boot)
#   sudo make -f mk/kernel.mk test-kernel KERNEL_TESTS=tests/kernel/test_x.py
#   sudo make -f mk/kernel.mk test-lane-only      the lane's own tests only (tests/kernel)
#   sudo make -f mk/kernel.mk kernel-image        build/refresh the cached guest only
#   HPNLAB_KERNEL_LANE=skip make test             skip the lane, saying so
#   sudo make -f mk/kernel.mk test-second-machine the second machine only (tests/remote)
#
# The lane's second part (issue 16): the same guest booted as a server on a private link
# (tools/scripts/kernel_lane/second_machine.sh), and tests/remote run on this machine against it.
#
# The kernel, initramfs and root image are cached machine-wide in
# $(HPNLAB_KERNEL_LANE_CACHE) (default /var/cache/hpnlab/kernel-lane), keyed by the
# kernel version, tools/scripts/kernel_lane/packages.txt and setup.cfg's requirements.

KERNEL_TESTS ?= tests/kernel
REMOTE_TESTS ?= tests/remote

.PHONY: test-kernel test-lane-only test-second-machine kernel-image

# both parts run, on one boot of the guest (it runs the lane's tests, then serves as the second
# machine; where that guest cannot run here, two boots: run.sh, then second_machine.sh);
# the target fails if either part failed
test-kernel:
	@tools/scripts/kernel_lane/second_machine.sh --kernel-tests "$(KERNEL_TESTS)" $(REMOTE_TESTS)

test-lane-only:
	@tools/scripts/kernel_lane/run.sh $(KERNEL_TESTS)

test-second-machine:
	@tools/scripts/kernel_lane/second_machine.sh $(REMOTE_TESTS)

kernel-image:
	@tools/scripts/kernel_lane/build.sh >/dev/null
