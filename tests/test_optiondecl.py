"""One declaration per option: the product code declares each option string once, and a child's command line
is written from the same declarations the child parses it with."""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

import pytest

from tailgate.optiondecl import SPECS, add_option, add_options, spec, to_flags
from tailgate.runner import LocustRun

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_DIRS = ("tailgate", "locustfiles", "shapes")

# Option strings two programs spell alike for different things. Each entry names its declarations; a new
# declaration of one of these strings anywhere else still fails.
ALLOWED_TWICE: dict[str, frozenset[str]] = {
    # the address the server under test is reached at (a URL) vs the address the ground-truth server binds
    "--host": frozenset({"tailgate/servers/spec.py", "tailgate/verify/groundtruth/cli.py"}),
    # the server port whose segments the capture process reads vs the port the ground-truth server listens on
    # vs the port `tailgate serve` starts the CPU vLLM on
    "--port": frozenset({"tailgate/load/capture.py", "tailgate/verify/groundtruth/cli.py", "tailgate/serve.py"}),
    # the model a Locust run asks for vs the model name the ground-truth server answers to
    "--model": frozenset({"tailgate/load/options.py", "tailgate/verify/groundtruth/cli.py"}),
}


def _declarations() -> dict[str, list[str]]:
    """Every option string given literally to an ``add_argument`` call, with where."""
    found: dict[str, list[str]] = defaultdict(list)
    for top in PRODUCT_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr != "add_argument":
                    continue
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                        found[arg.value].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_option_string_is_declared_by_two_add_argument_calls() -> None:
    repeated = []
    for option, places in sorted(_declarations().items()):
        files = {place.rsplit(":", 1)[0] for place in places}
        if len(places) > 1 and not (len(places) == len(files) and files <= ALLOWED_TWICE.get(option, frozenset())):
            repeated.append(f"{option}: {', '.join(places)}")
    assert not repeated, "declare a shared option once, in tailgate/optiondecl.py:\n" + "\n".join(repeated)


def test_the_table_declares_each_flag_and_dest_once_and_no_literal_declaration_repeats_it() -> None:
    flags = [flag for s in SPECS for flag in s.flags]
    assert len(flags) == len(set(flags))
    assert len({s.dest for s in SPECS}) == len(SPECS)
    literal = _declarations()
    assert not [flag for flag in flags if flag in literal], "an option in the table is also declared by hand"


def test_the_allow_list_names_only_declarations_that_exist() -> None:
    found = _declarations()
    for option, files in ALLOWED_TWICE.items():
        assert {place.rsplit(":", 1)[0] for place in found[option]} == files, option


def test_a_command_overrides_only_its_default_help_type_or_choices() -> None:
    parser = argparse.ArgumentParser()
    with pytest.raises(TypeError, match="--seed: action cannot differ"):
        add_option(parser, "seed", action="store_true")
    add_option(parser, "seed", default=11, help="another help")
    assert parser.parse_args([]).seed == 11
    assert parser.parse_args(["--seed", "3"]).seed == 3


def test_flags_written_from_the_table_parse_back_to_the_same_values() -> None:
    parser = argparse.ArgumentParser()
    names = ("rates", "n", "warmup", "seed", "ignore_eos", "realtime", "chunk_stamp", "prometheus_url", "locust_arg")
    add_options(parser, names)
    values = {"rates": "1,2.5", "n": 40, "warmup": 5, "seed": 9, "ignore_eos": True, "realtime": False,
              "chunk_stamp": "recv", "prometheus_url": "http://p:9090", "locust_arg": ["--a=1", "--b=2"]}  # fmt: skip
    parsed = vars(parser.parse_args(to_flags(values)))
    assert parsed == values
    assert to_flags({"rates": (1.0, 2.5), "chunk_stamp": None, "prometheus_url": ""}) == ["--rates", "1,2.5"]


def test_the_child_command_line_is_written_from_the_declarations() -> None:
    run = LocustRun(arm="continuous", host="http://h:1", results=Path("r"), stage=("--rates", "8"), n=3, warmup=1,
                    seed=7, config_label="chunked", processes=2, ignore_eos=True, prometheus_url="http://p",
                    realtime=True, chunk_stamp="kernel", extra=("--settle", "0"))  # fmt: skip
    cmd = run.command(master_port=5600)
    start = cmd.index("--host")
    assert cmd[start:start + 2] == ["--host", "http://h:1"]  # fmt: skip
    rest = cmd[start + 2 :]
    for dest, text in (("results_dir", "r"), ("config_label", "chunked"), ("n", "3"), ("warmup", "1"),
                       ("seed", "7"), ("prometheus_url", "http://p"), ("processes", "2"),
                       ("chunk_stamp", "kernel")):  # fmt: skip
        i = rest.index(spec(dest).flag)
        assert rest[i + 1] == text, dest
    assert spec("ignore_eos").flag in rest and spec("realtime").flag in rest
    assert rest[-2:] == ["--settle", "0"]
