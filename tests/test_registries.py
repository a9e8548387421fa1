"""The registries are the only place that knows their entries: a new arrival process is one module.

``tests/fixtures/arrival_fixed.py`` registers an evenly spaced process from outside the product; it is
loaded the way a user loads one (``TAILGATE_PLUGINS``) and run through a real Locust process against the
ground-truth server, and the records must follow it. No product file names it.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, load_records, load_summaries, run_locust

from tailgate.load import arrivals
from tailgate.verify.groundtruth import ServerProcess, start_server_process

FIXTURES = ROOT / "tests" / "fixtures"
PLUGIN_ENV = {
    "TAILGATE_PLUGINS": "arrival_fixed,prompts_sevens",
    "PYTHONPATH": os.pathsep.join([str(FIXTURES), str(ROOT)]),
}
PRODUCT = [ROOT / "tailgate", ROOT / "shapes", ROOT / "locustfiles", ROOT / "postprocess"]


def _child(code: str) -> str:
    """Run ``code`` in a fresh interpreter with the plugin named, as a user's command would be."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **PLUGIN_ENV},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_plugin_joins_every_option_that_lists_the_processes() -> None:
    out = _child(
        "from locust.argument_parser import get_parser\n"
        "from tailgate.load.options import add_arguments\n"
        "from tailgate.suitecommand import add_suite_arguments\n"
        "import argparse\n"
        "p = get_parser(); add_arguments(p)\n"
        "a = next(x for x in p._actions if x.dest == 'arrivals')\n"
        "print(list(a.choices)); print(a.help)\n"
        "s = argparse.ArgumentParser(); add_suite_arguments(s)\n"
        "print(list(next(x for x in s._actions if x.dest == 'arrivals').choices))\n"
        "from tailgate.suitecommand import workload_locust_args\n"
        "print(workload_locust_args(s.parse_args(['--arrivals', 'fixed', '--fixed-phase', '0.25'])))\n"
    )
    locust_choices, help_text, suite_choices, passed_on = out.splitlines()
    assert locust_choices == "['poisson', 'gamma', 'trace', 'fixed']"
    assert help_text.endswith("fixed (evenly spaced, 1/rate apart)")
    assert suite_choices == "['poisson', 'gamma', 'fixed']"  # a replayed file is not a suite's process
    assert passed_on == "['--arrivals', 'fixed', '--fixed-phase', '0.25']"


def test_a_missing_plugin_is_one_line_and_exit_2() -> None:
    env = {**os.environ, "TAILGATE_PLUGINS": "no_such_plugin_module"}
    done = subprocess.run([sys.executable, "-m", "tailgate.cli", "suite", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tailgate: error: TAILGATE_PLUGINS: cannot import 'no_such_plugin_module' "
        "(No module named 'no_such_plugin_module')"
    ]


def test_a_name_is_registered_once_and_unknown_names_list_the_known() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        arrivals.register(arrivals.ARRIVALS["gamma"])
    with pytest.raises(arrivals.ArrivalError, match="choose one of poisson, gamma, trace"):
        arrivals.arrival_process("uniform")


def test_endpoints_come_from_their_registry_and_build_the_same_bodies() -> None:
    """The registry's endpoints build exactly the bodies the payload functions always built."""
    from tailgate.contracts import OrderConfig
    from tailgate.load.orderrequests import request_body
    from tailgate.load.payloads import ENDPOINTS, build_chat_payload, build_payload
    from tailgate.load.prompts import Prompt

    cfg = OrderConfig(model="m", ignore_eos=True)
    assert list(ENDPOINTS) == ["completions", "chat"]
    assert request_body(cfg, Prompt(text=" a b"), 4, "completions") == build_payload("m", " a b", 4, ignore_eos=True)
    turn = [{"role": "user", "content": " a b"}]
    assert request_body(cfg, Prompt(text=" a b"), 4, "chat") == build_chat_payload("m", turn, 4, ignore_eos=True)
    asked = Prompt(messages=(("system", "s"), ("user", "u")))
    assert request_body(cfg, asked, 4, "chat") == build_chat_payload("m", asked.wire()["messages"], 4, ignore_eos=True)


def _is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    return isinstance(parent, ast.Expr)


REGISTRY_FILES = {ROOT / "tailgate" / "load" / f for f in ("arrivals.py", "payloads.py", "promptsources.py")}


def test_no_product_module_but_a_registry_names_its_entries() -> None:
    """An arrival process's, an endpoint's or a prompt source's name in code outside its registry (a comparison,
    a choices tuple, a default) is a second place a new one would have to be added; ``trace`` is also a warm-up
    rule and a subcommand, so only comparisons against an ``arrivals`` value count for it, and a prompt source
    (``seed``, ``dataset`` are also options) only in a comparison with a prompt source."""
    from tailgate.load.payloads import ENDPOINTS
    from tailgate.load.promptsources import SOURCES

    names = set(arrivals.ARRIVALS) | set(ENDPOINTS)
    sources = set(SOURCES)  # "seed" and "dataset" are also options: only comparisons with a prompt source count
    found = []
    for folder in PRODUCT:
        for path in folder.rglob("*.py"):
            if path in REGISTRY_FILES:
                continue
            tree = ast.parse(path.read_text(), str(path))
            parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(tree):
                named = isinstance(node, ast.Constant) and node.value in names - {"trace"}
                if named and not _is_docstring(node, parents):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
                for axis, known in (("arrivals", names), ("prompt", sources)):
                    if isinstance(node, ast.Compare) and axis in ast.unparse(node):
                        sides = [node.left, *node.comparators]
                        if any(isinstance(s, ast.Constant) and s.value in known for s in sides):
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


@pytest.fixture(scope="module")
def gt() -> Iterator[ServerProcess]:
    with start_server_process(ttft_ms=5, gap_ms=2) as server:
        yield server


def test_a_plugin_process_runs_end_to_end(gt: ServerProcess, tmp_path: Path) -> None:
    """20 req/s, phase 0.5: request i is due 25 ms + 50 ms x i after the stage's start, and goes out then."""
    results = tmp_path / "fixed"
    done = run_locust("continuous.py", gt.base_url, results, "--arrivals", "fixed", "--rates", "20", "--n", "24",
                      "--warmup", "2", "--settle", "0", "--no-metrics", env=PLUGIN_ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (summary,) = load_summaries(results).values()
    assert summary["stage_label"] == "cont_r20_fixed" and summary["arrivals"] == "fixed"
    records = sorted(load_records(results), key=lambda r: r["trace_id"])
    assert len(records) == 26 and all(r["arrivals"] == "fixed" and r["error_class"] is None for r in records)
    intended = [r["intended_s"] for r in records]
    for a, b in itertools.pairwise(intended):
        assert b - a == pytest.approx(0.05, abs=1e-6)
    # the sends follow the plan: the typical gap is the planned one (a busy 2-core machine delays a few sends)
    sent = [r["sent_s"] for r in records]
    assert statistics.median(b - a for a, b in itertools.pairwise(sent)) == pytest.approx(0.05, abs=0.01)
    meta = json.loads((results / "run.json").read_text())
    assert meta["workload"]["arrivals"] == "fixed" and meta["workload"]["fixed_phase"] == 0.5


def test_a_plugin_prompt_source_is_offered_and_sent_end_to_end(gt: ServerProcess, tmp_path: Path) -> None:
    """``--prompts sevens`` from a test-only module: listed by Locust's and the suite's ``--prompts``, built
    before the run, sent as built, recorded under its name with the server's count equal to the plan."""
    out = _child(
        "from locust.argument_parser import get_parser\n"
        "from tailgate.load.options import add_arguments\n"
        "from tailgate.suitecommand import parse_prompt_sources\n"
        "p = get_parser(); add_arguments(p)\n"
        "print(list(next(x for x in p._actions if x.dest == 'prompts').choices))\n"
        "print(parse_prompt_sources('seed,sevens'))\n"
    )
    locust_choices, suite_sources = out.splitlines()
    assert locust_choices == "['seed', 'unique', 'dataset', 'prefix', 'sevens']"
    assert suite_sources == "('seed', 'sevens')"
    results = tmp_path / "sevens"
    done = run_locust("continuous.py", gt.base_url, results, "--prompts", "sevens", "--rates", "20", "--n", "6",
                      "--warmup", "0", "--settle", "0", "--no-metrics", env=PLUGIN_ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = load_records(results)
    assert len(records) == 6
    assert {r["prompt_source"] for r in records} == {"sevens"}
    assert all(r["prompt_tokens"] == r["prompt_tokens_planned"] for r in records), records
    run = json.loads((results / "run.json").read_text())
    assert run["workload"]["prompts"] == "sevens"
    assert run["workload"]["prompt_check"]["built_by"] == "prompts_sevens"


def test_no_product_module_but_a_registry_compares_a_configuration_or_an_arm_by_name() -> None:
    """A configuration's name compared with a ``config`` value outside ``tailgate/serverconfigs.py``, or an arm's
    with an ``arm`` value outside ``tailgate/arms.py``, is a second place a new one would have to be added; the
    code asks the configuration or the arm for the property it needs instead."""
    from tailgate.arms import ARMS
    from tailgate.serverconfigs import CONFIGS

    registries = {"config": (ROOT / "tailgate" / "serverconfigs.py", set(CONFIGS)),
                  "arm": (ROOT / "tailgate" / "arms.py", set(ARMS))}  # fmt: skip
    found = []
    for folder in PRODUCT:
        for path in folder.rglob("*.py"):
            if "verify" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                for axis, (home, names) in registries.items():
                    named = any(isinstance(s, ast.Constant) and s.value in names for s in sides)
                    if path != home and axis in ast.unparse(node) and named:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_the_server_configurations_keep_their_flags_and_roles() -> None:
    from tailgate.serverconfigs import CHUNKED_OFF_FLAG, CHUNKED_PAIR, CONFIGS, DEFAULT, preempting

    assert list(CONFIGS) == ["chunked", "nochunk", "preempt"]
    assert DEFAULT.engine_default and DEFAULT.gpu_flags == ()
    on, off = CHUNKED_PAIR
    assert on.chunked_prefill and not off.chunked_prefill and CHUNKED_OFF_FLAG in off.gpu_flags
    assert [c.name for c in CONFIGS.values() if c.preempts] == ["preempt"] and not preempting("my-label")
