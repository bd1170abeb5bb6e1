"""ovs_sched on a process of the test's own (the emulation tests check ovs-vswitchd itself)."""
import os
import subprocess

import pytest

from hpnlab.fabric.emulation import ovs_sched

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority needs root (CAP_SYS_NICE)")


@pytest.fixture
def proc():
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def test_boost_gives_nice_minus_20_without_a_real_time_policy(proc):
    ovs_sched.boost(proc)
    assert os.sched_getscheduler(proc) == os.SCHED_OTHER
    assert os.getpriority(os.PRIO_PROCESS, proc) == ovs_sched.NICE


def test_restore_puts_back_what_saved_recorded(proc):
    os.setpriority(os.PRIO_PROCESS, proc, 5)
    before = ovs_sched.saved(proc)
    ovs_sched.boost(proc)
    ovs_sched.restore(proc, *before)
    assert (os.sched_getscheduler(proc), os.sched_getparam(proc).sched_priority,
            os.getpriority(os.PRIO_PROCESS, proc)) == (os.SCHED_OTHER, 0, 5) == before


def test_an_earlier_releases_real_time_policy_is_saved_as_the_default(proc):
    os.sched_setscheduler(proc, os.SCHED_RR, os.sched_param(ovs_sched.OLD_RT_PRIORITY))
    assert ovs_sched.saved(proc)[:2] == (os.SCHED_OTHER, 0)


def test_another_real_time_policy_is_saved_as_it_is(proc):
    os.sched_setscheduler(proc, os.SCHED_FIFO, os.sched_param(7))
    assert ovs_sched.saved(proc)[:2] == (os.SCHED_FIFO, 7)


def test_rr_mode_sets_the_earlier_releases_real_time_policy(proc):
    assert ovs_sched.boost(proc, "rr") == {"policy": "SCHED_RR", "priority": ovs_sched.OLD_RT_PRIORITY}
    assert (os.sched_getscheduler(proc), os.sched_getparam(proc).sched_priority) == (os.SCHED_RR, 5)


def test_an_unknown_mode_is_refused_and_changes_nothing(proc):
    before = ovs_sched.saved(proc)
    with pytest.raises(ValueError, match="known: nice, rr, deadline"):
        ovs_sched.boost(proc, "fifo")
    assert ovs_sched.saved(proc) == before


def test_apply_records_what_to_put_back_before_it_changes_anything(proc, tmp_path, monkeypatch):
    pid_file = tmp_path / "ovs-vswitchd.pid"
    pid_file.write_text(f"{proc}\n")
    monkeypatch.setattr(ovs_sched, "PID_FILE", pid_file)
    before = ovs_sched.saved(proc)
    seen = []
    old, now = ovs_sched.apply(record=lambda *entry: seen.append((entry, ovs_sched.saved(proc))))
    assert seen == [((proc, *before), before)]          # recorded while the thread was still untouched
    assert old == (proc, *before) and now == {"policy": "SCHED_OTHER", "nice": ovs_sched.NICE}
    assert os.getpriority(os.PRIO_PROCESS, proc) == ovs_sched.NICE
