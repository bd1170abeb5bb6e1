"""What this machine can do for an emulation: capability probes (read-only, no changes).

``probe()`` returns a ``Capabilities`` record:

* ``root`` - running as uid 0;
* ``ovs_version``, ``ovs_running`` (ovsdb answers ``ovs-vsctl show``),
  ``ovs_kernel_datapath`` (the ``openvswitch`` module / ``ovs_datapath`` genetlink family
  exists), ``ovs_userspace_tso`` (``other_config:userspace-tso-enable``);
* ``qdiscs`` - for each of htb, tbf, netem, red, clsact, fq_codel: whether the kernel
  has it (module loaded, built in, or loadable), ``netem``/``red`` shortcuts;
* ``bpf`` (bpf syscall + BTF), ``bpffs`` (mounted), ``clang``, ``bpftool``, ``tc_bpf``
  (classifier ``bpf`` available);
* ``os_ken`` (importable, with version), ``mininet``, ``mnexec``, ``iperf3``, ``ping``,
  ``ethtool``, ``telnet``; ``cpus``, ``mem_gib``.

Nothing here needs root except the netlink read of genetlink families, which falls back to
``/proc`` and ``/sys`` when it cannot run. ``fix_for(name)`` gives the command that closes
each gap (shown by ``hpnlab doctor``).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

QDISCS = ("htb", "tbf", "netem", "red", "clsact", "fq_codel")
# module name of each qdisc (kernel config symbol NET_SCH_*)
_QDISC_MODULE = {"htb": "sch_htb", "tbf": "sch_tbf", "netem": "sch_netem", "red": "sch_red",
                 "clsact": "sch_ingress", "fq_codel": "sch_fq_codel"}

FIXES = {
    "root": "run it with sudo",
    "ovs_installed": "sudo apt-get install openvswitch-switch  (or: sudo make install)",
    "ovs_running": "sudo /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random  (or: sudo make ovs)",
    "ovs_kernel_datapath": "sudo modprobe openvswitch  (needs a kernel with CONFIG_OPENVSWITCH; "
                           "otherwise the userspace datapath is used)",
    "netem": "sudo modprobe sch_netem  (Ubuntu: sudo apt-get install linux-modules-extra-$(uname -r); "
             "otherwise a kernel with CONFIG_NET_SCH_NETEM)",
    "red": "sudo modprobe sch_red  (a kernel with CONFIG_NET_SCH_RED)",
    "htb": "sudo modprobe sch_htb  (a kernel with CONFIG_NET_SCH_HTB)",
    "clsact": "sudo modprobe sch_ingress  (a kernel with CONFIG_NET_SCH_INGRESS)",
    "tc_bpf": "sudo modprobe cls_bpf  (a kernel with CONFIG_NET_CLS_BPF)",
    "bpf": "a kernel with CONFIG_BPF_SYSCALL and CONFIG_DEBUG_INFO_BTF",
    "clang": "sudo apt-get install clang llvm libbpf-dev",
    "bpftool": "sudo apt-get install bpftool",
    "os_ken": "make venv  (installs os-ken into .venv)",
    "mininet": "make venv  (installs mininet into .venv) and sudo apt-get install mininet (mnexec)",
    "mnexec": "sudo apt-get install mininet",
    "iperf3": "sudo apt-get install iperf3",
    "ping": "sudo apt-get install iputils-ping",
    "ethtool": "sudo apt-get install ethtool",
}


@dataclass
class Capabilities:
    root: bool = False
    cpus: int = 1
    mem_gib: float = 0.0
    kernel: str = ""
    ovs_installed: bool = False
    ovs_version: str | None = None
    ovs_running: bool = False
    ovs_kernel_datapath: bool = False
    ovs_userspace_tso: bool = False
    qdiscs: dict[str, bool] = field(default_factory=dict)
    tc_bpf: bool = False
    bpf: bool = False
    bpffs: bool = False
    clang: bool = False
    bpftool: bool = False
    os_ken: str | None = None
    mininet: str | None = None
    mnexec: bool = False
    iperf3: bool = False
    ping: bool = False
    ethtool: bool = False

    @property
    def netem(self) -> bool:
        return self.qdiscs.get("netem", False)

    @property
    def red(self) -> bool:
        return self.qdiscs.get("red", False)

    @property
    def htb(self) -> bool:
        return self.qdiscs.get("htb", False)

    @property
    def datapath(self) -> str:
        """The OVS datapath an emulation uses here: 'kernel' or 'user'."""
        return "kernel" if self.ovs_kernel_datapath else "user"

    @property
    def ecn_mechanism(self) -> str | None:
        """How switch egress ports mark ECN here: 'red' where the kernel has sch_red (what a
        user's full kernel has, and what switches do), else the eBPF marker, else None."""
        if self.red:
            return "red"
        if self.bpf and self.clang and self.bpftool and self.tc_bpf and self.qdiscs.get("clsact"):
            return "bpf"
        return None

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(netem=self.netem, red=self.red, datapath=self.datapath,
                   ecn_mechanism=self.ecn_mechanism)
        return out


def _run(*cmd: str, timeout: float = 5.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _modules_dir() -> Path:
    return Path("/lib/modules") / os.uname().release


def kernel_has(module: str, config_symbol: str | None = None) -> bool:
    """True when a kernel feature is loaded, built in, or loadable as a module."""
    if Path("/sys/module", module).exists():
        return True
    mdir = _modules_dir()
    builtin = mdir / "modules.builtin"
    if builtin.is_file() and f"/{module}.ko" in builtin.read_text():
        return True
    dep = mdir / "modules.dep"
    if dep.is_file() and f"/{module}.ko" in dep.read_text():
        return True
    if config_symbol:
        for cfg in (Path("/boot") / f"config-{os.uname().release}", Path("/proc/config.gz")):
            if cfg.is_file():
                try:
                    if cfg.suffix == ".gz":
                        import gzip
                        text = gzip.decompress(cfg.read_bytes()).decode()
                    else:
                        text = cfg.read_text()
                except OSError:
                    continue
                if f"{config_symbol}=y" in text or f"{config_symbol}=m" in text:
                    return True
    return False


def qdisc_works(kind: str) -> bool:
    """Whether `tc` can create this qdisc: tried on a throw-away dummy-free path.

    Without root this falls back to ``kernel_has``. With root it asks the kernel directly
    by creating the qdisc on a veth pair in a private network namespace that is deleted at
    once (nothing outside that namespace is touched).
    """
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return kernel_has(_QDISC_MODULE.get(kind, f"sch_{kind}"))
    return kind in _probe_qdiscs_in_netns((kind,))


def _probe_qdiscs_in_netns(kinds: tuple[str, ...]) -> set[str]:
    ns = f"hpnlab-probe-{os.getpid()}"
    works: set[str] = set()
    if _run("ip", "netns", "add", ns) is None:
        return works
    try:
        _run("ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
        for kind in kinds:
            if kind == "clsact":
                args = ["clsact"]
            elif kind == "red":
                args = ["root", "red", "limit", "400000", "min", "30000", "max", "90000", "avpkt", "1000",
                        "burst", "55", "ecn", "bandwidth", "10mbit"]
            elif kind == "netem":
                args = ["root", "netem", "delay", "1ms"]
            elif kind == "htb":
                args = ["root", "handle", "1:", "htb"]
            elif kind == "tbf":
                args = ["root", "tbf", "rate", "1mbit", "burst", "10kb", "latency", "50ms"]
            else:
                args = ["root", kind]
            r = _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "pa", *args)
            if r is not None and r.returncode == 0:
                works.add(kind)
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "pa",
                 "clsact" if kind == "clsact" else "root")
        r = _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "pb", "clsact")
        if r is not None and r.returncode == 0:
            # cls_bpf: an empty filter list is listed fine; ask tc to parse a bpf filter help
            r = _run("ip", "netns", "exec", ns, "tc", "filter", "add", "dev", "pb", "egress", "bpf",
                     "bytecode", "1,6 0 0 4294967295,", "classid", "1")
            if r is not None and r.returncode == 0:
                works.add("tc_bpf")
    finally:
        _run("ip", "netns", "del", ns)
    return works


def probe(deep: bool = True) -> Capabilities:
    """Probe the machine. ``deep`` (as root) tries qdiscs for real in a private netns."""
    c = Capabilities()
    c.root = os.geteuid() == 0
    c.cpus = os.cpu_count() or 1
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                c.mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    c.kernel = os.uname().release
    c.ovs_installed = shutil.which("ovs-vsctl") is not None
    if c.ovs_installed:
        from .emulation import ovsdb
        c.ovs_version = ovsdb.version()
        c.ovs_running = ovsdb.answers()
        if c.ovs_running:
            c.ovs_userspace_tso = ovsdb.userspace_tso()
    c.ovs_kernel_datapath = Path("/sys/module/openvswitch").exists()
    if c.root and deep:
        works = _probe_qdiscs_in_netns(QDISCS)
        c.qdiscs = {q: q in works for q in QDISCS}
        c.tc_bpf = "tc_bpf" in works
    else:
        c.qdiscs = {q: kernel_has(_QDISC_MODULE[q]) for q in QDISCS}
        c.tc_bpf = kernel_has("cls_bpf", "CONFIG_NET_CLS_BPF")
    c.bpf = Path("/sys/kernel/btf/vmlinux").exists() and Path("/proc/sys/kernel/unprivileged_bpf_disabled").exists()
    c.bpffs = any(line.split()[2] == "bpf" for line in Path("/proc/mounts").read_text().splitlines()
                  if len(line.split()) > 2)
    c.clang = shutil.which("clang") is not None
    c.bpftool = shutil.which("bpftool") is not None
    c.os_ken = _dist_version("os-ken", "os_ken")
    c.mininet = _dist_version("mininet", "mininet")
    c.mnexec = shutil.which("mnexec") is not None
    c.iperf3 = shutil.which("iperf3") is not None
    c.ping = shutil.which("ping") is not None
    c.ethtool = shutil.which("ethtool") is not None
    return c


def _dist_version(dist: str, module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "unknown"


def fix_for(name: str) -> str:
    return FIXES.get(name, "")
