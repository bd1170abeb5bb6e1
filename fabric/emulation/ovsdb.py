"""Every ``ovs-vsctl`` call the emulation makes: one module between hpnlab and ovsdb.

Reads (bridges, marked rows, controller connections) return plain values; writes take plain
names. Rows hpnlab creates carry ``external_ids:hpnlab-run=<run id>`` (``OVS_MARK``), so a
cleanup can find exactly them and nothing else.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from typing import Any

OVS_MARK = "hpnlab-run"


def _vsctl(*args: str, timeout: int = 5, **kw: Any) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["ovs-vsctl", f"--timeout={timeout}", *args], capture_output=True, text=True,
                              timeout=timeout + 5, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:   # not installed, or hung: as a failed call
        return subprocess.CompletedProcess(["ovs-vsctl", *args], 127, "", str(exc))


# ---- what the capability probe (hpnlab.fabric.emulation.kernel) asks ----------------------------------

def version() -> str | None:
    """Open vSwitch's version (``ovs-vsctl --version``), or None."""
    r = _vsctl("--version")
    return r.stdout.splitlines()[0].rsplit(" ", 1)[-1] if r.returncode == 0 and r.stdout.strip() else None


def answers() -> bool:
    """ovsdb answers (``ovs-vsctl show``)."""
    return _vsctl("show", timeout=3).returncode == 0


def userspace_tso() -> bool:
    """``other_config:userspace-tso-enable`` is true."""
    r = _vsctl("get", "Open_vSwitch", ".", "other_config:userspace-tso-enable", timeout=3)
    return r.returncode == 0 and "true" in r.stdout


def iface_types() -> list[str]:
    """The interface types this ovs-vswitchd supports (``iface_types``: system, afxdp, ...)."""
    r = _vsctl("get", "Open_vSwitch", ".", "iface_types", timeout=3)
    return parse_set(r.stdout) if r.returncode == 0 else []


def parse_set(text: str) -> list[str]:
    """An ovs-vsctl set value (``[a, b, "c"]``) as a list of strings (pure)."""
    inner = text.strip().strip("[]")
    return [t.strip().strip('"') for t in inner.split(",") if t.strip()]


def port_type_args(port_type: str) -> str:
    """The ``set Interface`` columns of a switch port of this type (pure): nothing for
    ``system``; AF_XDP in generic XDP mode on veths (they have no native zero-copy)."""
    return "" if port_type == "system" else f" type={port_type} options:xdp-mode=generic"


# ---- the emulation's rows ------------------------------------------------------------------


def _list(table: str, columns: str) -> list[list[Any]] | None:
    """Rows of one table as JSON values (``--format=json``), or None when ovsdb does not answer."""
    r = _vsctl("--format=json", f"--columns={columns}", "list", table)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout).get("data", [])


def _uuids(cell: Any) -> list[str]:
    """A reference column's uuids: ``["uuid", u]`` or ``["set", [["uuid", u], ...]]``."""
    if isinstance(cell, list) and cell and cell[0] == "uuid":
        return [cell[1]]
    if isinstance(cell, list) and cell and cell[0] == "set":
        return [u[1] for u in cell[1]]
    return []


def bridges() -> set[str]:
    """Names of every OVS bridge on the machine (ours or not)."""
    return set(_vsctl("list-br").stdout.split())


def marked(table: str, id_column: str) -> dict[str, str]:
    """Rows of an OVS table carrying ``external_ids:hpnlab-run``: row id -> run id."""
    out: dict[str, str] = {}
    for row_id, ext in _list(table, f"{id_column},external_ids") or []:
        pairs = dict(ext[1]) if isinstance(ext, list) and ext and ext[0] == "map" else {}
        if OVS_MARK in pairs:
            # _uuid comes as ["uuid", "<id>"]; a name is a plain string
            out[row_id[1] if isinstance(row_id, list) else row_id] = pairs[OVS_MARK]
    return out


def marked_bridges() -> dict[str, str]:
    """OVS bridges carrying ``external_ids:hpnlab-run``: name -> run id."""
    return marked("Bridge", "name")


def marked_qos() -> dict[str, str]:
    """OVS QoS rows (a root table: they outlive their ports) marked hpnlab-run: uuid -> run id."""
    return marked("QoS", "_uuid")


def delete_bridges(names: Iterable[str]) -> str | None:
    """Delete these bridges in one transaction; the error text, or None."""
    args: list[str] = []
    for b in names:
        args += ["--", "--if-exists", "del-br", b]
    if not args:
        return None
    r = _vsctl(*args, timeout=20)
    return r.stderr.strip() if r.returncode != 0 else None


def destroy_qos(uuids: Iterable[str]) -> None:
    args: list[str] = []
    for u in uuids:
        args += ["--", "--if-exists", "destroy", "QoS", u]
    if args:
        _vsctl(*args, timeout=20)


def noop_qos_args(name: str, ports: list[str], run_id: str) -> str:
    """ovs-vsctl arguments that give ports one marked linux-noop QoS row: OVS then leaves the
    ports' qdiscs (hpnlab's htb and clsact) alone. For ``OVSSwitch.vsctl``."""
    qid = f"noop_{name}"
    return (f"-- --id=@{qid} create QoS type=linux-noop external_ids:{OVS_MARK}={run_id} "
            + " ".join(f"-- set Port {p} qos=@{qid}" for p in ports))


def connected(names: Iterable[str]) -> dict[str, bool]:
    """Bridge name -> whether any of its controllers is connected (only the named bridges)."""
    rows = _list("Bridge", "name,controller")
    ctls = _list("Controller", "_uuid,is_connected")
    if rows is None or ctls is None:
        return {}
    conn = {row[0][1]: row[1] for row in ctls}
    wanted = set(names)
    return {name: any(conn.get(u) is True for u in _uuids(ctl)) for name, ctl in rows if name in wanted}


def set_inactivity_probe(names: Iterable[str], ms: int) -> None:
    """OVS drops a controller that leaves its echo unanswered this long (OVS default 5 s)."""
    wanted = set(names)
    for name, ctl in _list("Bridge", "name,controller") or []:
        if name in wanted:
            for uuid in _uuids(ctl):
                _vsctl("set", "controller", uuid, f"inactivity_probe={int(ms)}", timeout=10)


# ---- BFD and port liveness ----------------------------------------------------------------
#
# How Open vSwitch ties BFD to OpenFlow liveness (read in ovs v3.1.0, checked here by the
# emulation tests): ``ofproto-dpif.c:port_run`` computes ``enable = carrier &&
# may_enable_port()``, and ``may_enable_port`` is false while a BFD-enabled interface's
# session is not forwarding (``bfd_forwarding``). ``ofproto.c:ofproto_port_set_enable`` then
# clears ``OFPPS_LIVE`` (``normalize_state``) and sends a PortStatus (OFPPR_MODIFY) to every
# controller; the datapath is revalidated (``REV_PORT_TOGGLED``), and fast-failover buckets
# follow it: ``ofproto-dpif-xlate.c:bucket_is_alive`` -> ``odp_port_is_alive`` reads that same
# ``may_enable``. The link itself keeps its carrier (no OFPPS_LINK_DOWN): a controller must
# read LIVE, not only LINK_DOWN. BFD control packets (UDP 3784) are consumed by OVS before
# the OpenFlow tables (``process_special``), so they never reach the controller's rules.

#: BFD detect multiplier (RFC 5880 DetectMult; OVS's default)
BFD_MULT = 3


def bfd_args(interfaces: Iterable[str], min_rx_ms: int, min_tx_ms: int | None = None,
             mult: int = BFD_MULT) -> list[str]:
    """ovs-vsctl arguments that enable BFD on these interfaces (pure); ``min_rx_ms`` 0 disables it."""
    args: list[str] = []
    for name in interfaces:
        if min_rx_ms <= 0:
            args += ["--", "remove", "Interface", name, "bfd", "enable", "min_rx", "min_tx", "mult"]
        else:
            args += ["--", "set", "Interface", name, "bfd:enable=true", f"bfd:min_rx={int(min_rx_ms)}",
                     f"bfd:min_tx={int(min_tx_ms or min_rx_ms)}", f"bfd:mult={int(mult)}"]
    return args


def set_bfd(interfaces: Iterable[str], min_rx_ms: int, min_tx_ms: int | None = None,
            mult: int = BFD_MULT) -> str | None:
    """Enable (or, with ``min_rx_ms`` 0, disable) BFD on these interfaces in one transaction;
    the error text, or None."""
    args = bfd_args(interfaces, min_rx_ms, min_tx_ms, mult)
    if not args:
        return None
    r = _vsctl(*args, timeout=20)
    return r.stderr.strip() if r.returncode != 0 else None


def bfd_status(interfaces: Iterable[str]) -> dict[str, dict[str, str]]:
    """Interface name -> its ``bfd_status`` map (state, forwarding, diagnostic, remote_state...)."""
    wanted = set(interfaces)
    out: dict[str, dict[str, str]] = {}
    for name, status in _list("Interface", "name,bfd_status") or []:
        if name in wanted:
            out[name] = dict(status[1]) if isinstance(status, list) and status and status[0] == "map" else {}
    return out


def port_states(bridge: str) -> dict[str, set[str]]:
    """Interface name -> its OpenFlow port state flags (``LINK_DOWN``, ``BLOCKED``, ``LIVE``) as
    the switch reports them to controllers (``ovs-ofctl dump-ports-desc``)."""
    try:
        r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports-desc", bridge], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_port_states(r.stdout) if r.returncode == 0 else {}


def parse_port_states(text: str) -> dict[str, set[str]]:
    """Parse ``ovs-ofctl dump-ports-desc`` output into name -> state flags (pure)."""
    out: dict[str, set[str]] = {}
    name = None
    for line in text.splitlines():
        s = line.strip()
        if "(" in s and "):" in s and s.split("(", 1)[0].strip().replace("LOCAL", "0").isdigit():
            name = s.split("(", 1)[1].split(")", 1)[0]
            out[name] = set()
        elif name is not None and s.startswith("state:"):
            out[name] = set(s.split(":", 1)[1].split()) - {"0"}
    return out


# ---- OpenFlow over TLS: the SSL row is one per Open vSwitch instance (machine-wide) -------------

SSL_FIELDS = ("private_key", "certificate", "ca_cert", "bootstrap_ca_cert")


def parse_ssl(text: str) -> dict[str, Any] | None:
    """``ovs-vsctl get-ssl``'s answer as plain values (pure): None when no SSL is configured."""
    names = {"Private key": "private_key", "Certificate": "certificate", "CA Certificate": "ca_cert",
             "Bootstrap": "bootstrap_ca_cert"}
    out: dict[str, Any] = {}
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if sep and label.strip() in names:
            out[names[label.strip()]] = value.strip()
    if not out.get("private_key"):
        return None
    out["bootstrap_ca_cert"] = out.get("bootstrap_ca_cert", "false") == "true"
    return out


def get_ssl() -> dict[str, Any] | None:
    """The SSL settings Open vSwitch has now (key, certificate, CA, bootstrap), or None."""
    r = _vsctl("get-ssl")
    return parse_ssl(r.stdout) if r.returncode == 0 else None


def set_ssl(key: str, cert: str, ca: str, bootstrap: bool = False) -> str | None:
    """Make Open vSwitch use these files for every ``ssl:`` connection; an error line, or None."""
    r = _vsctl(*(["--bootstrap"] if bootstrap else []), "set-ssl", key, cert, ca, timeout=10)
    return None if r.returncode == 0 else (r.stderr.strip() or f"ovs-vsctl set-ssl exited {r.returncode}")


def restore_ssl(previous: dict[str, Any] | None) -> str | None:
    """Put back the SSL settings ``get_ssl`` read (None: there were none, so remove them). The SSL
    row's other columns (``ssl_protocols``, ``ssl_ciphers``, ``external_ids``) are not kept."""
    if previous is None:
        r = _vsctl("del-ssl", timeout=10)
        return None if r.returncode == 0 else (r.stderr.strip() or f"ovs-vsctl del-ssl exited {r.returncode}")
    return set_ssl(previous["private_key"], previous["certificate"], previous["ca_cert"],
                   bool(previous.get("bootstrap_ca_cert")))
