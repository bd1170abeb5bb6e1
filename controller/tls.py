"""OpenFlow over TLS: the controller's key, certificate and CA, checked before os-ken starts.

os-ken's OpenFlow server (``os_ken.controller.controller.OpenFlowController.server_loop``) listens
with TLS when its options ``ctl_privkey`` and ``ctl_cert`` are set, on ``ofp_ssl_listen_port``
(its plain TCP listener is then not opened), and requires every switch to present a certificate
signed by ``ca_certs`` (``ssl.CERT_REQUIRED``). hpnlab always asks for all three: a controller
that accepted any switch's certificate would let anyone who reaches the port program the fabric.

``tools/scripts/make_test_ca.sh DIR`` makes a test CA with a controller and a switch certificate in
the layout ``hpnlab.fabric.emulation.controller_process.TLS_FILES`` names.
"""
from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpnlab.fabric.errors import UserError


@dataclass(frozen=True)
class TlsFiles:
    """The controller's private key, its certificate, and the CA certificate(s) switches must be signed by."""
    key: str
    cert: str
    ca: str


def given(key: str | None, cert: str | None, ca: str | None) -> TlsFiles | None:
    """The TLS files given as ``--ssl-key``, ``--ssl-cert``, ``--ssl-ca``, as absolute paths, unread: None
    when none is given; UserError (one line) when only some are."""
    flags = {"--ssl-key": key, "--ssl-cert": cert, "--ssl-ca": ca}
    if not any(flags.values()):
        return None
    missing = [flag for flag, value in flags.items() if not value]
    if missing:
        raise UserError(f"TLS needs --ssl-key, --ssl-cert and --ssl-ca together; missing {', '.join(missing)} "
                        f"(tools/scripts/make_test_ca.sh DIR makes a test set)")
    return TlsFiles(str(Path(str(key)).resolve()), str(Path(str(cert)).resolve()), str(Path(str(ca)).resolve()))


def from_flags(key: str | None, cert: str | None, ca: str | None) -> TlsFiles | None:
    """The TLS files given as ``--ssl-key``, ``--ssl-cert``, ``--ssl-ca``: None when none is given;
    UserError (one line) when only some are, or a file is missing or unreadable, or the key is not
    the certificate's, or the CA file holds no certificate."""
    files = given(key, cert, ca)
    if files is None:
        return None
    for flag, value in {"--ssl-key": key, "--ssl-cert": cert, "--ssl-ca": ca}.items():
        path = Path(str(value))
        if not path.is_file():
            raise UserError(f"{flag} {value}: no such file")
        try:
            path.read_bytes()
        except OSError as exc:
            raise UserError(f"{flag} {value}: cannot read it ({exc.strerror})") from None
    check(files)
    return files


def check(files: TlsFiles) -> None:
    """Load the files the way the OpenFlow server will (``ssl.SSLContext``): a key that does not
    match its certificate, or a CA file without a certificate, is one line now rather than a
    traceback when the first switch connects."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise UserError(f"--ssl-cert {files.cert} and --ssl-key {files.key} do not go together, or are not PEM "
                        f"({exc.reason or exc})") from None
    try:
        ctx.load_verify_locations(files.ca)
    except ssl.SSLError as exc:
        raise UserError(f"--ssl-ca {files.ca}: not a PEM CA certificate ({exc.reason or exc})") from None
    if not ctx.get_ca_certs():
        raise UserError(f"--ssl-ca {files.ca}: holds no CA certificate")


def os_ken_args(files: TlsFiles | None, listen: str, port: int) -> list[str]:
    """os-ken's own command-line options for the OpenFlow listener: plain TCP, or TLS on the same port."""
    common = ["--ofp-listen-host", listen]
    if files is None:
        return ["--ofp-tcp-listen-port", str(port), *common]
    return ["--ofp-ssl-listen-port", str(port), *common,
            "--ctl-privkey", files.key, "--ctl-cert", files.cert, "--ca-certs", files.ca]


class HandshakeFilter(logging.Filter):
    """os-ken's hub logs a switch whose TLS handshake fails (an untrusted certificate, a plain TCP
    connection) as an uncaught exception with a traceback; make it one warning line saying why."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "SSL" not in text or "Traceback" not in text:
            return True
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        reason = last.split(":", 1)[1].strip() if ":" in last else last
        record.msg, record.args = "OpenFlow TLS handshake refused: %s", (reason,)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def green_server(hub: Any) -> None:
    """Make os-ken's OpenFlow server do TLS with eventlet's cooperative ``ssl``.

    The launcher patches only ``thread`` (``hub.patch(thread=True)`` is ``eventlet.monkey_patch(thread=True)``,
    which leaves ``socket`` and ``ssl`` alone), so os-ken's ``ssl.SSLContext(...).wrap_socket`` would
    turn a switch's green socket into a blocking one: the handshake and every read then stop the
    whole controller, and switches over ``ssl:`` time out (seen with Open vSwitch 3.1). The green
    module has the same names; only the OpenFlow server's reference is replaced."""
    if getattr(hub, "HUB_TYPE", None) != "eventlet":
        return
    from eventlet.green import ssl as green_ssl  # type: ignore[import-untyped]
    from os_ken.controller import controller
    controller.ssl = green_ssl
