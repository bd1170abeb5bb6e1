"""OpenFlow over TLS, pure: the controller's TLS flags, the test CA's layout, Open vSwitch's SSL row."""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO, SCRIPTS

from hpnlab.controller import tls
from hpnlab.fabric.emulation import ovsdb
from hpnlab.fabric.emulation.controller_process import TLS_FILES, tls_args, tls_files
from hpnlab.fabric.errors import UserError

ROOT = REPO
MAKE_CA = SCRIPTS / "make_test_ca.sh"


def make_ca(directory: Path, name: str = "hpnlab test") -> Path:
    subprocess.run(["sh", str(MAKE_CA), str(directory), name], check=True, capture_output=True, timeout=60)
    return directory


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> Path:
    return make_ca(tmp_path_factory.mktemp("ca"))


def test_the_test_ca_script_writes_every_file_of_the_layout(ca):
    assert sorted(p.name for p in ca.iterdir()) == sorted([*TLS_FILES.values(), "ca-key.pem"])


def test_both_certificates_of_the_test_ca_verify_against_its_ca(ca):
    for role in ("controller", "switch"):
        r = subprocess.run(["openssl", "verify", "-CAfile", str(ca / "ca-cert.pem"), str(ca / f"{role}-cert.pem")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_private_keys_are_readable_by_their_owner_only(ca):
    for name in ("ca-key.pem", "controller-key.pem", "switch-key.pem"):
        assert (ca / name).stat().st_mode & 0o077 == 0


def test_no_tls_flag_means_plain_tcp():
    assert tls.from_flags(None, None, None) is None
    assert tls.os_ken_args(None, "127.0.0.1", 6653) == ["--ofp-tcp-listen-port", "6653",
                                                         "--ofp-listen-host", "127.0.0.1"]


def test_the_three_files_make_os_ken_listen_with_tls_on_the_same_port(ca):
    files = tls.from_flags(str(ca / "controller-key.pem"), str(ca / "controller-cert.pem"), str(ca / "ca-cert.pem"))
    assert files is not None
    args = tls.os_ken_args(files, "0.0.0.0", 6654)
    assert args[:2] == ["--ofp-ssl-listen-port", "6654"] and "--ofp-tcp-listen-port" not in args
    assert dict(zip(args[4::2], args[5::2], strict=True)) == {
        "--ctl-privkey": files.key, "--ctl-cert": files.cert, "--ca-certs": files.ca}


@pytest.mark.parametrize("missing", ["key", "cert", "ca"])
def test_tls_without_one_of_the_three_files_is_one_line_naming_it(ca, missing):
    given: dict[str, str | None] = {"key": str(ca / "controller-key.pem"), "cert": str(ca / "controller-cert.pem"),
             "ca": str(ca / "ca-cert.pem")}
    given[missing] = None
    with pytest.raises(UserError, match=f"missing --ssl-{missing}"):
        tls.from_flags(given["key"], given["cert"], given["ca"])


def test_a_file_that_does_not_exist_is_one_line(ca, tmp_path):
    with pytest.raises(UserError, match=r"--ssl-ca .*no such file"):
        tls.from_flags(str(ca / "controller-key.pem"), str(ca / "controller-cert.pem"), str(tmp_path / "nope.pem"))


def test_a_key_that_is_not_the_certificates_is_refused_before_starting(ca):
    with pytest.raises(UserError, match="do not go together"):
        tls.from_flags(str(ca / "switch-key.pem"), str(ca / "controller-cert.pem"), str(ca / "ca-cert.pem"))


def test_a_ca_file_that_is_not_a_certificate_is_refused(ca, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(UserError, match="--ssl-ca"):
        tls.from_flags(str(ca / "controller-key.pem"), str(ca / "controller-cert.pem"), str(junk))


def test_a_failed_handshake_traceback_becomes_one_warning_line():
    record = logging.LogRecord("os_ken.lib.hub", logging.ERROR, __file__, 1, "hub: uncaught exception: %s",
                               ("Traceback (most recent call last):\n  File \"x\", line 1\n"
                                "ssl.SSLError: [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (_ssl.c:992)\n",),
                               None)
    assert tls.HandshakeFilter().filter(record)
    assert record.levelname == "WARNING" and "\n" not in record.getMessage()
    assert record.getMessage() == ("OpenFlow TLS handshake refused: [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert "
                                   "unknown ca (_ssl.c:992)")


def test_other_hub_errors_pass_unchanged():
    record = logging.LogRecord("os_ken.lib.hub", logging.ERROR, __file__, 1, "hub: uncaught exception: %s",
                               ("Traceback (most recent call last):\nKeyError: 3\n",), None)
    tls.HandshakeFilter().filter(record)
    assert record.levelname == "ERROR" and "KeyError" in record.getMessage()


def test_a_tls_directory_gives_the_controller_its_own_files(ca):
    files = tls_files(ca)
    assert tls_args(files) == ["--ssl-key", str(ca / "controller-key.pem"), "--ssl-cert",
                               str(ca / "controller-cert.pem"), "--ssl-ca", str(ca / "ca-cert.pem")]


def test_a_tls_directory_missing_a_file_is_one_line_naming_it(ca, tmp_path):
    for name in TLS_FILES.values():
        if name != "switch-cert.pem":
            (tmp_path / name).write_bytes((ca / name).read_bytes())
    with pytest.raises(UserError, match=r"lacks switch-cert\.pem"):
        tls_files(tmp_path)


def test_ovs_get_ssl_output_is_read_into_its_fields():
    text = ("Private key: /etc/k.pem\nCertificate: /etc/c.pem\nCA Certificate: /etc/ca.pem\n"
            "Bootstrap: false\n")
    assert ovsdb.parse_ssl(text) == {"private_key": "/etc/k.pem", "certificate": "/etc/c.pem",
                                     "ca_cert": "/etc/ca.pem", "bootstrap_ca_cert": False}


def test_ovs_without_ssl_reads_as_none():
    assert ovsdb.parse_ssl("") is None
