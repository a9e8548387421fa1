"""One server declaration for every command: the same kinds, options and controllers in suite and slo."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tailgate.servers import ComposeByConfig, FixedServer, ManualServer
from tailgate.servers.spec import SERVER_KINDS, ServerSpec, add_server_arguments, make_controller
from tailgate.servers.sweep import CommandServer, ComposeWithFlags
from tailgate.slo.command import add_slo_arguments
from tailgate.suitecommand import add_suite_arguments, suite_server

ROOT = Path(__file__).resolve().parents[1]


def _server_options() -> dict[str, argparse.Action]:
    p = argparse.ArgumentParser()
    add_server_arguments(p)
    return {o: a for a in p._actions for o in a.option_strings if o != "-h" and o != "--help"}


@pytest.mark.parametrize("add", [add_suite_arguments, add_slo_arguments], ids=["suite", "slo"])
def test_every_command_that_runs_cells_offers_the_same_server_options(add) -> None:
    p = argparse.ArgumentParser()
    add(p)
    theirs = {o: a for a in p._actions for o in a.option_strings}
    for option, action in _server_options().items():
        assert option in theirs, option
        assert theirs[option].choices == action.choices and theirs[option].default == action.default, option


def _spec(kind: str, tmp_path: Path, **kw) -> ServerSpec:
    return ServerSpec(kind=kind, host="http://127.0.0.1:9", results=tmp_path, tag="[t]", **kw)


@pytest.mark.parametrize(
    ("kind", "kw", "cls"),
    [
        ("url", {}, FixedServer),
        ("manual", {}, ManualServer),
        ("command", {"restart_command": "true {flags}"}, CommandServer),
        ("compose", {}, ComposeWithFlags),
        ("compose", {"config_overrides": {"chunked": (), "nochunk": ("x.yml",)}}, ComposeByConfig),
    ],
)
def test_one_constructor_builds_each_kind(tmp_path: Path, kind: str, kw: dict, cls: type) -> None:
    controller = make_controller(_spec(kind, tmp_path, **kw), log=lambda line: None)
    assert isinstance(controller, cls)
    assert controller.base_url == "http://127.0.0.1:9"


def test_the_kinds_say_who_stops_the_server() -> None:
    assert {k for k, v in SERVER_KINDS.items() if v.stopped_at_end} == {"local", "command"}
    assert {k for k, v in SERVER_KINDS.items() if v.up_already} == {"url"}
    assert {k for k, v in SERVER_KINDS.items() if not v.has_url} == {"local"}


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"kind": "warp"}, "--server"),
        ({"kind": "command"}, "--restart-command"),
        ({"kind": "command", "restart_command": "start.sh"}, "{flags}"),
        ({"kind": "url", "restart_command": "start.sh {flags}"}, "--server command"),
        ({"kind": "local", "placement": "nowhere"}, "--placement"),
    ],
)
def test_specs_that_cannot_work_are_refused_before_anything_starts(tmp_path: Path, kw: dict, option: str) -> None:
    spec = ServerSpec(host="http://127.0.0.1:9", results=tmp_path, **kw)
    assert spec.problems() and option in spec.problems()[0]
    with pytest.raises(ValueError, match="--"):
        make_controller(spec, log=lambda line: None)


def test_the_suite_gives_compose_an_override_file_per_configuration(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    add_suite_arguments(p)
    args = p.parse_args(["--server", "compose", "--compose-file", "base.yml"])
    spec = suite_server(args, tmp_path)
    assert spec.compose_files == ("base.yml",)
    assert spec.config_overrides == {
        "chunked": (),
        "nochunk": ("docker-compose.nochunk.yml",),
        "preempt": ("docker-compose.preempt.yml",),
    }


@pytest.mark.parametrize("command", ["suite", "slo"])
def test_a_restart_command_without_flags_is_one_line_in_both_commands(tmp_path: Path, command: str) -> None:
    extra = ["--slo", "ttft_p99<=1s"] if command == "slo" else []
    done = subprocess.run(
        [sys.executable, "-m", "tailgate.cli", command, *extra, "--server", "command",
         "--restart-command", "start.sh", "--results", str(tmp_path / "r")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "{flags}" in lines[0] and "Traceback" not in done.stderr, done.stderr
