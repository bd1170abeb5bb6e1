"""Hostile and oversized scenario input (issue 15): every bad input gets one line and exit 2.

The contract, for any scenario input (file, preset name, ``--set`` override, Python call):
either a correct fabric, or exactly one line on stderr (``hpnlab: ...``, bounded length),
nothing on stdout, exit code 2, no traceback, within bounded time and memory. Each row of
the tables below is one class of bad input; most run in-process through the real ``main``,
a representative subset as the installed command in a subprocess under a memory and CPU
limit, so that a regression fails instead of hanging the suite or the machine.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hpnlab.cli.main import main
from hpnlab.fabric.errors import MESSAGE_LIMIT, one_line, short
from hpnlab.fabric.scenario import graph, spec

# ---- the malformed inputs, one class per row ----------------------------------------


def _laughs(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs" YAML value: width**levels strings once expanded, a few hundred bytes written."""
    text = "[&x0 [" + ",".join(["lol"] * width) + "]"
    for i in range(1, levels):
        text += f", &x{i} [" + ",".join([f"*x{i - 1}"] * width) + "]"
    return text + "]"


#: file name -> (content, what the one line must mention)
BAD_FILES: dict[str, tuple[bytes, str]] = {
    "latin1": (b"name: caf\xe9\n", "not UTF-8"),
    "utf16": ("name: x\n".encode("utf-16"), "not UTF-8"),
    "binary": (bytes(range(256)) * 4, "not UTF-8"),
    "nul_byte": (b"name: x\x00\n", "not valid YAML"),
    "oversized_file": (b"name: x\n#" + b"a" * (spec.MAX_FILE_BYTES + 10) + b"\n", "KiB"),
    "deep_sequence": (b"name: x\nplanes: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested"),
    "unclosed_brackets_filling_the_file": (b"[" * spec.MAX_FILE_BYTES, "nested"),
    "thousands_of_tokens": (b"name: x\nplanes: [" + b",".join([b"1"] * 30_000) + b"]\n", "tokens"),
    "thousands_of_keys": (b"".join(b"k%d: %d\n" % (i, i) for i in range(5000)), "tokens"),
    "deep_mapping": (b"name: x\nlong_haul: " + b"{a: " * 3000 + b"1" + b"}" * 3000 + b"\n", "nested"),
    "alias_bomb": (f"name: x\nkind: {_laughs()}\n".encode(), "aliases"),
    "alias_bomb_in_key": (f"name: x\n? {_laughs()}\n: 1\n".encode(), "aliases"),
    "merge_key_alias": (b"base: &b {planes: 2}\nname: x\n<<: *b\n", "aliases"),
    "duplicate_key": (b"name: x\nplanes: banana\nplanes: 2\n", "lines 2 and 3"),
    "duplicate_key_in_block": (b"name: x\nemulation:\n  mtu: 1500\n  mtu: 9000\n", "given twice"),
    "newline_in_key": (b'name: x\n"plan\\nes": 2\n', "unknown field"),
    "megabyte_like_value": (b"name: x\nkind: " + b"a" * 60_000 + b"\n", "kind"),
    "huge_integer": (b"name: x\naccelerators_per_host: 1" + b"0" * 400 + b"\n", "at most"),
    "integer_beyond_int_digits": (b"name: x\nplanes: " + b"9" * 5000 + b"\n", "YAML"),
    "float_overflow": (b"name: x\nrails: 1.0e+308\n", "at most"),
    "infinite_rate": (b"name: x\nhost_rate_gbps: .inf\n", "finite"),
    "nan_rate": (b"name: x\nhost_rate_gbps: .nan\n", "positive"),
    "bad_timestamp": (b"name: 2024-13-45\n", "YAML"),
    "unhashable_key": (b"name: x\n? [a, b]\n: 1\n", "a key must be a plain value"),
    "number_as_key": (b"name: x\n1: 2\n", "unknown field"),
    "top_level_list": (b"- a\n- b\n", "mapping"),
    "two_documents": (b"name: x\n---\nname: y\n", "YAML"),
    "python_tag": (b"name: !!python/object/apply:os.system ['true']\n", "YAML"),
    "name_with_newline": (b'name: "a\\nb"\n', "one line"),
    "name_too_long": (b"name: " + b"n" * 500 + b"\n", "characters"),
    "dpid_plane_overflow": (b"name: x\nplanes: 257\nrails: 1\nhosts_per_segment: 1\n", "8 bits of plane"),
    "millions_of_hosts": (b"name: x\nrails: 1\nplanes: 1\nhosts_per_segment: 30000\nsegments_per_pod: 100\n"
                          b"spines_per_plane: 1\nswitch_radix: 65536\n", "HPNLAB_MAX_"),
    "absurd_long_haul": (b"name: x\nrails: 1\nplanes: 2\nhosts_per_segment: 1\nspines_per_plane: 1\ncampuses: 256\n"
                         b"cores_per_plane: 1000\nswitch_radix: 65536\nlong_haul: {links: 200}\n", "HPNLAB_MAX_LINKS"),
    "empty": (b"", "empty"),
}

#: case -> (argv after "topo inspect", what the one line must mention)
BAD_ARGS: dict[str, tuple[list[str], str]] = {
    "set_not_yaml": (["mini-hpn", "--set", "planes=[1"], "not valid YAML"),
    "set_value_and_group": (["mini-hpn", "--set", "planes=1", "--set", "planes.x=2"], "both as a value"),
    "set_group_of_a_number": (["mini-hpn", "--set", "planes.x=2"], "whole number"),
    "set_float_overflow": (["mini-hpn", "--set", "rails=1.0e+308"], "at most"),
    "set_plan_cannot_fit": (["mini-hpn", "--set", "planes=1000000000"], "at most 256"),
    "set_alias": (["mini-hpn", "--set", "name=[&a x, *a]"], "aliases"),
    "set_alias_bomb": (["mini-hpn", "--set", f"name={_laughs()}"], "aliases"),
    "set_empty_key": (["mini-hpn", "--set", "=1"], "override"),
    "set_bad_key": (["mini-hpn", "--set", "a..b=1"], "override"),
    "set_no_equals": (["mini-hpn", "--set", "planes"], "field=value"),
    "set_newline_in_key": (["mini-hpn", "--set", "plan\nes=2"], "override"),
    "set_too_long": (["mini-hpn", "--set", "name=" + "x" * 5000], "characters"),
    "set_deep": (["mini-hpn", "--set", "name=" + "[" * 100 + "]" * 100], "nested"),
    "set_unknown_field_of_megabytes": (["mini-hpn", "--set", "x" * 4000 + "=1"], "unknown field"),
    "set_257_planes": (["mini-hpn", "--set", "planes=257"], "8 bits of plane"),
    "set_257_campuses": (["cross-campus", "--set", "campuses=257"], "8 bits of campus"),
    "set_bool_count": (["mini-hpn", "--set", "planes=true"], "whole number"),
    "preset_name_too_long": (["x" * 5000], "unknown preset"),
    "file_name_too_long": (["x" * 300 + ".yaml"], "no such file"),
    "preset_name_with_newline": (["mini\nhpn"], "unknown preset"),
    "preset_path_traversal": (["../setup"], "unknown preset"),
    "fat_tree_beyond_the_size_limit": (["fat-tree-512"], "HPNLAB_MAX_LINKS"),
    "fat_tree_with_a_huge_k": (["fat-tree-" + "9" * 5000], "unknown preset"),
    "fat_tree_odd": (["fat-tree-5"], "even"),
    "unknown_flag": (["mini-hpn", "--bogus"], "unrecognized"),
}


def _one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err[:300]!r}"
    line = err.rstrip("\n")
    assert line.startswith("hpnlab: ") and "Traceback" not in line
    assert len(line) <= MESSAGE_LIMIT + len("hpnlab: ")
    return line


def _inspect_in_process(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        code = main(["topo", "inspect", *argv])
    except SystemExit as exc:   # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert out == ""
    return code, _one_line(err)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_gets_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    content, mentions = BAD_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(content)
    code, line = _inspect_in_process(capsys, [str(path)])
    assert code == 2
    assert mentions in line and str(path) in line


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_a_bad_argument_gets_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, mentions = BAD_ARGS[case]
    code, line = _inspect_in_process(capsys, argv)
    assert code == 2
    assert mentions in line


def test_a_bad_flag_of_another_command_gets_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["topo", "plan", "mini-hpn", "--hosts", "many"])
    assert info.value.code == 2
    assert "--hosts" in _one_line(capsys.readouterr().err)


def test_an_address_plan_that_cannot_fit_names_the_bits(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HPNLAB_MAX_LINKS", str(10 ** 12))
    monkeypatch.setenv("HPNLAB_MAX_NODES", str(10 ** 12))
    code, line = _inspect_in_process(capsys, ["fat-tree-258"])
    assert code == 2 and "address plan needs 25 host bits" in line


def test_a_size_limit_that_is_not_a_number_gets_one_line(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HPNLAB_MAX_LINKS", "lots")
    code, line = _inspect_in_process(capsys, ["mini-hpn"])
    assert code == 2 and "HPNLAB_MAX_LINKS" in line


# ---- the installed command, under a memory and CPU limit ------------------------------

#: what a refused input may cost: the interpreter with networkx and numpy imported is ~60 MB
#: resident; address space is larger (allocator arenas), so the cap on it is generous.
MEMORY_CAP = 1 << 30
CPU_CAP_S = 20


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_CAP_S, CPU_CAP_S))


def _hpnlab(*argv: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    exe = Path(sys.executable).with_name("hpnlab")
    command: list[str | bytes] = [str(exe)] if exe.exists() else [sys.executable, "-m", "hpnlab.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPNLAB_MAX_")}
    return subprocess.run([*command, *argv], capture_output=True, timeout=60, preexec_fn=_limited, cwd=cwd,
                          env=env)


SUBPROCESS_FILES = ["latin1", "binary", "deep_sequence", "thousands_of_tokens", "alias_bomb", "duplicate_key",
                    "huge_integer", "millions_of_hosts", "absurd_long_haul", "dpid_plane_overflow"]
SUBPROCESS_ARGS = ["set_not_yaml", "set_float_overflow", "set_alias_bomb", "preset_name_too_long",
                   "fat_tree_beyond_the_size_limit", "set_newline_in_key", "unknown_flag"]


@pytest.mark.parametrize("case", SUBPROCESS_FILES)
def test_the_command_refuses_a_bad_file_in_one_line_within_its_limits(tmp_path: Path, case: str) -> None:
    content, mentions = BAD_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(content)
    result = _hpnlab("topo", "inspect", str(path))
    assert result.returncode == 2 and result.stdout == b""
    assert mentions in _one_line(result.stderr.decode())


@pytest.mark.parametrize("case", SUBPROCESS_ARGS)
def test_the_command_refuses_a_bad_argument_in_one_line_within_its_limits(case: str) -> None:
    argv, mentions = BAD_ARGS[case]
    result = _hpnlab("topo", "inspect", *argv)
    assert result.returncode == 2 and result.stdout == b""
    assert mentions in _one_line(result.stderr.decode())


def test_a_scenario_name_that_is_not_utf8_gets_one_line() -> None:
    result = _hpnlab("topo", "inspect", b"caf\xe9-hpn")
    assert result.returncode == 2
    line = _one_line(result.stderr.decode())
    assert "unknown preset" in line and "\\udce9" in line


def test_an_override_that_is_not_utf8_gets_one_line() -> None:
    result = _hpnlab("topo", "inspect", "mini-hpn", "--set", b"name=caf\xe9")
    assert result.returncode == 2
    assert "character #xdce9" in _one_line(result.stderr.decode())


@pytest.mark.parametrize("command", [["model"], ["doctor"], ["controller"]])
def test_every_command_that_reads_a_scenario_refuses_an_alias_bomb_in_one_line(tmp_path: Path,
                                                                              command: list[str]) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_bytes(BAD_FILES["alias_bomb"][0])
    result = _hpnlab(*command, str(path))
    assert result.returncode == 2
    assert "aliases" in _one_line(result.stderr.decode())


def test_the_command_still_builds_a_good_scenario_within_its_limits() -> None:
    result = _hpnlab("topo", "inspect", "mini-hpn")
    assert result.returncode == 0 and result.stderr == b""
    assert b"mini-hpn (hpn)" in result.stdout


# ---- the Python API ------------------------------------------------------------------

class _HostileRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no")


def _cyclic() -> dict:
    d: dict = {}
    d["self"] = d
    return d


@pytest.mark.parametrize("value", [10 ** 400, float("inf"), float("nan"), 1e308, _HostileRepr(), _cyclic(),
                                   "x" * 1_000_000, b"\xff" * 100, [[[[[[[[1]]]]]]]], "a\nb", -1, True])
def test_from_dict_refuses_any_bad_count_in_one_short_line(value: object) -> None:
    with pytest.raises(spec.ScenarioError) as info:
        spec.from_dict({"name": "x", "planes": value})
    message = str(info.value)
    assert message.startswith("planes: ") and "\n" not in message and len(message) <= MESSAGE_LIMIT


def test_from_dict_accepts_an_integer_of_any_integral_type() -> None:
    numpy = pytest.importorskip("numpy")
    s = spec.from_dict({"name": "x", "planes": numpy.int64(2), "rails": 1, "hosts_per_segment": 2})
    assert s.planes == 2 and type(s.planes) is int


def test_a_scenario_made_in_python_beyond_a_dpid_is_refused_by_build() -> None:
    s = spec.load("mini-hpn").replace(planes=300)
    with pytest.raises(spec.ScenarioError, match="8 bits of plane"):
        graph.build(s)


def test_load_refuses_what_is_not_a_name() -> None:
    with pytest.raises(spec.ScenarioError, match="preset name or a file"):
        spec.load(42)  # type: ignore[arg-type]


def test_load_refuses_a_name_with_a_nul_byte() -> None:
    with pytest.raises(spec.ScenarioError, match="unknown preset"):
        spec.load("mini-hpn\x00.x")


# ---- the helpers that keep a message to one line --------------------------------------

def test_one_line_escapes_line_breaks_and_controls() -> None:
    assert one_line("a\nb\tc\u2028d\x1b") == "a\\nb\\tc\\u2028d\\x1b"


def test_one_line_cuts_long_text_to_its_limit() -> None:
    text = one_line("y" * 10_000, 50)
    assert len(text) == 50 and text.endswith("...")


def test_short_names_the_digits_of_a_huge_number_instead_of_printing_it() -> None:
    assert short(10 ** 400) == "<a number of about 401 digits>"


def test_short_shows_two_levels_of_a_deep_value() -> None:
    deep: list = [1]
    for _ in range(10_000):
        deep = [deep]
    assert short(deep) == "[[[...]]]"


# ---- the collective tool's flags -----------------------------------------------------------

BAD_COLLECTIVE_FLAGS: dict[str, tuple[list[str], str]] = {
    "rate_nan": (["--line-rate", "nan"], "not a rate"),
    "rate_overflow": (["--line-rate", "1e999"], "not a rate"),
    "rate_empty": (["--line-rate", ""], "not a rate"),
    "size_overflow": (["-b", "1e400"], "not a size"),
    "size_nan": (["-e", "nan"], "not a size"),
    "size_text": (["-b", "abc"], "not a size"),
    "factor_nan": (["-f", "nan"], "--stepfactor"),
    "factor_one": (["-f", "1"], "-f must be greater than 1"),
    "iters_text": (["-n", "many"], "--iters"),
    "iters_negative": (["-n", "-1"], "--iters"),
    "window_zero": (["--window", "0"], "--window"),
    "timeout_nan": (["--timeout", "nan"], "--timeout"),
    "port_too_big": (["--port", "70000"], "--port"),
    "ports_per_nic_zero": (["--ports-per-nic", "0"], "--ports-per-nic"),
    "mtu_too_big": (["--mtu", "99999999"], "--mtu"),
    "pace_inf": (["--pace", "inf"], "--pace"),
    "unknown_collective": (["--perm", "bogus"], "permutation"),
    "newline_in_hosts": (["--launcher", "x\ny"], "--launcher"),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", sorted(BAD_COLLECTIVE_FLAGS))
def test_a_bad_collective_flag_gets_one_line_before_any_rank_starts(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   case: str) -> None:
    from hpnlab.fabric.experiments import runner as experiment

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a rank was started")

    monkeypatch.setattr(experiment, "run", never)
    flags, mentions = BAD_COLLECTIVE_FLAGS[case]
    try:
        code = main(["collective", "all_reduce", "--hosts", "127.0.0.2,127.0.0.3", *flags])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert mentions in _one_line(captured.err)


# ---- paths a command writes ------------------------------------------------------------------

@pytest.mark.parametrize("argv,mentions", [
    (["topo", "export", "mini-hpn", "-o", "/tmp/" + "x" * 300 + "/g.json"], "too long"),
    (["topo", "export", "mini-hpn", "-o", "/"], "is a folder"),
    (["topo", "export", "mini-hpn", "-o", "/no/such/folder/g.json"], "does not exist"),
    (["collective", "all_reduce", "--hosts", "127.0.0.2,127.0.0.3", "--out", "/etc/hostname"], "not a folder"),
    (["emulate", "mini-hpn", "--json", "/"], "is a folder"),
])
def test_an_output_path_the_file_system_refuses_gets_one_line_before_anything_runs(
        capsys: pytest.CaptureFixture[str], argv: list[str], mentions: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert mentions in _one_line(capsys.readouterr().err)
