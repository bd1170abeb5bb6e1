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
  ``ethtool``, ``telnet``; ``cpus``, ``mem_gib``;
* ``ovs_iface_types`` (``ovs-vsctl get Open_vSwitch . iface_types``) and ``af_xdp`` (the
  kernel opens an AF_XDP socket): which switch port types the userspace datapath can use.

``choose_port_type`` (pure) picks the port type of a run from those facts, what the run
needs (tc egress on switch ports) and the measured budget; ``hpnlab doctor`` shows its choice.

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

from hpnlab.fabric.emulation import ovsdb
from hpnlab.fabric.errors import UserError

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
    "afxdp": "Open vSwitch built with AF_XDP (Debian/Ubuntu openvswitch-switch >= 2.13 has it) and a kernel "
             "with CONFIG_XDP_SOCKETS",
}

#: switch port types on the userspace datapath: AF_PACKET, AF_XDP with PMD threads, AF_XDP polled
#: by the main thread (ovs-vswitchd's netdev types ``system``, ``afxdp``, ``afxdp-nonpmd``)
PORT_TYPES = ("system", "afxdp", "afxdp-nonpmd")
#: what ``--port-type`` accepts
PORT_TYPE_CHOICES = ("auto", *PORT_TYPES)
#: environment variable that forces the port type (``--port-type`` wins over it)
PORT_TYPE_ENV = "HPNLAB_PORT_TYPE"
#: why AF_XDP cannot carry a shaped or ECN-marking switch port (measured, tools/bench/bench_ports.py --tc-check)
AFXDP_TC_BYPASS = ("AF_XDP transmits with a direct transmit (generic XDP mode on veth) that bypasses tc "
                   "egress: the switch ports' htb shaping and the ECN stage see none of the packets")


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
    ovs_iface_types: list[str] = field(default_factory=list)
    af_xdp: bool = False

    @property
    def afxdp_types(self) -> list[str]:
        """The AF_XDP port types this OVS and kernel can use (empty when either lacks it)."""
        return [t for t in PORT_TYPES if t != "system" and t in self.ovs_iface_types] if self.af_xdp else []

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
                   ecn_mechanism=self.ecn_mechanism, afxdp_types=self.afxdp_types)
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
        c.ovs_version = ovsdb.version()
        c.ovs_running = ovsdb.answers()
        if c.ovs_running:
            c.ovs_userspace_tso = ovsdb.userspace_tso()
            c.ovs_iface_types = ovsdb.iface_types()
    c.af_xdp = af_xdp_socket()
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


def af_xdp_socket() -> bool:
    """Whether the kernel opens an AF_XDP socket (CONFIG_XDP_SOCKETS; needs CAP_NET_RAW)."""
    import socket
    family = getattr(socket, "AF_XDP", 44)
    try:
        socket.socket(family, socket.SOCK_RAW, 0).close()
        return True
    except OSError:
        return False


def port_type_request(flag: str | None, env: dict[str, str] | None = None) -> str:
    """The port type asked for: the flag, else ``$HPNLAB_PORT_TYPE``, else 'auto' (pure given env)."""
    value = flag or (env if env is not None else os.environ).get(PORT_TYPE_ENV) or "auto"
    if value not in PORT_TYPE_CHOICES:
        where = "--port-type" if flag else PORT_TYPE_ENV
        raise UserError(f"{where} must be one of {', '.join(PORT_TYPE_CHOICES)}, got {value!r}")
    return value


def choose_port_type(requested: str, datapath: str, afxdp_types: list[str], needs_tc_egress: list[str],
                     measured: dict[str, float] | None = None,
                     refused: dict[str, str] | None = None) -> tuple[str, str, list[str]]:
    """The switch port type of a run (pure): (port type, why, what it will NOT emulate).

    ``requested``: 'auto' or one of ``PORT_TYPES`` (forced). ``afxdp_types``: the AF_XDP types
    usable here (``Capabilities.afxdp_types``). ``needs_tc_egress``: the run's features that
    live in tc egress on switch ports (``shaping``, ``ECN marking``); AF_XDP bypasses them, so
    'auto' keeps ``system`` when any is wanted, and a forced AF_XDP type lists them as not
    emulated. ``measured``: packets/s each port type carried here (the measured budget);
    'auto' takes the AF_XDP type that carried more, and ``afxdp-nonpmd`` (no busy-polled
    core taken from the generators) when nothing was measured. ``refused``: AF_XDP types the
    measurement found unable to carry this run (type -> why, e.g. its frame size); 'auto'
    leaves them out and a forced one is refused."""
    refused = refused or {}
    if requested not in PORT_TYPE_CHOICES:
        raise UserError(f"port type must be one of {', '.join(PORT_TYPE_CHOICES)}, got {requested!r}")
    lost = [f"{f} on switch ports: {AFXDP_TC_BYPASS}" for f in needs_tc_egress]
    if requested == "system":
        return "system", "forced (AF_PACKET)", []
    if requested != "auto":
        if datapath != "user":
            raise UserError(f"port type {requested} needs the userspace datapath; this run uses the {datapath} one")
        if requested not in afxdp_types:
            raise UserError(f"port type {requested} is not available here (Open vSwitch or the kernel lacks "
                            f"AF_XDP); use --port-type system or auto")
        if requested in refused:
            raise UserError(f"port type {requested} cannot carry this run here: {refused[requested]}")
        return requested, "forced", lost
    if datapath != "user":
        return "system", f"the {datapath} datapath forwards in the kernel (AF_XDP is for the userspace one)", []
    if not afxdp_types:
        return "system", "Open vSwitch or the kernel lacks AF_XDP, so AF_PACKET", []
    usable = [t for t in afxdp_types if t not in refused]
    if not usable:
        return "system", "AF_XDP cannot carry this run here (" + "; ".join(
            f"{t}: {refused[t]}" for t in afxdp_types) + ")", []
    afxdp_types = usable
    if needs_tc_egress:
        return "system", (f"AF_XDP is available ({', '.join(afxdp_types)}) but this run needs "
                          f"{' and '.join(needs_tc_egress)} on switch ports, which AF_XDP bypasses"), []
    rates = {t: (measured or {}).get(t) for t in afxdp_types}
    known = {t: r for t, r in rates.items() if r}
    if known:
        best = max(known, key=lambda t: known[t])
        return best, f"AF_XDP, {best} carried the most here ({known[best]:,.0f} packets/s measured)", []
    best = "afxdp-nonpmd" if "afxdp-nonpmd" in afxdp_types else afxdp_types[0]
    return best, f"AF_XDP, {best} (nothing measured yet: the type that leaves every core to the generators)", []


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
