#!/usr/bin/env bash
# beside.sh PARENT_PID COMMAND...: run COMMAND with only the CPU time others leave idle, for as
# long as PARENT_PID lives (make test runs the unit stage this way beside the emulation stage).
#
# nice alone is not enough where the kernel groups tasks by session (CONFIG_SCHED_AUTOGROUP,
# on in Debian's and Ubuntu's kernels): the scheduler first shares the CPU between sessions, and
# Mininet's hosts and Open vSwitch each run in sessions of their own, so a niced task in make's
# session still took its session's full share from them (measured: a deployment test's install
# took 15.7 s instead of 8.2 s). So COMMAND gets a session of its own whose group is niced to 19
# (/proc/self/autogroup), and within it keeps its own priorities; where the kernel has no
# autogroups, COMMAND runs at nice 19 instead.
#
# If PARENT_PID ends first (make interrupted), COMMAND's process group is ended: nothing is left
# running that this script started. Exit: COMMAND's status.
set -uo pipefail
parent=${1:?usage: beside.sh PARENT_PID COMMAND...}
shift
if [ "$(ps -o sid= $$ | tr -d ' ')" != $$ ]; then
    # not yet the leader of a session of our own: become one (setsid forks where we lead a group)
    exec setsid -w "$0" "$parent" "$@"
fi
if echo 19 2>/dev/null > /proc/self/autogroup; then
    "$@" &                  # the session's group is niced: within it, COMMAND orders its own parts
else
    nice -n 19 "$@" &       # no autogroups here: the tasks' own nice is what the scheduler weighs
fi
child=$!
trap 'kill -TERM -- -$$ 2>/dev/null' TERM INT
while kill -0 "$child" 2>/dev/null; do
    if ! kill -0 "$parent" 2>/dev/null; then
        echo "beside.sh: pid $parent ended: ending $* (process group $$)" >&2
        trap '' TERM
        kill -TERM -- -$$ 2>/dev/null
        break
    fi
    sleep 1
done
wait "$child"
