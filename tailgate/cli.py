"""``tailgate``: the suite's command line.

    tailgate suite --embedded              # everything on this machine: CPU vLLM, tiny model, report
    tailgate suite --server compose ...    # the GPU box from docker-compose.yml
    tailgate report RESULTS_DIR            # table, charts, HTML report, diagnosis
    tailgate slo --slo ... --config ...    # highest rate meeting an SLO, per server configuration
    tailgate trace --out trace.jsonl       # the seeded trace, to inspect or edit
    tailgate make-model DIR                # the tiny dummy-weight model the CPU server uses
    tailgate serve                         # that CPU server on http://127.0.0.1:8000 until Ctrl-C
    tailgate locust -f locustfiles/continuous.py ...   # Locust with the suite's options in its --help

Every bad input ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tailgate.lifecycle import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, ArgumentParser, usage_error
from tailgate.optiondecl import add_options
from tailgate.optiontable import OptionError, check_counts
from tailgate.plugins import load_plugins
from tailgate.serve import add_serve_arguments, run_serve
from tailgate.suitecommand import add_suite_arguments, run_suite


def run_trace(args: argparse.Namespace, prog: str) -> int:
    from tailgate.load.workload import make_trace, mix_of, save_jsonl

    try:
        check_counts(args.n, args.warmup, ordered=False)
    except OptionError as e:
        return usage_error(prog, str(e))
    items = make_trace(args.n + args.warmup, args.seed)
    try:
        save_jsonl(items, args.out)
    except OSError as e:
        return usage_error(prog, f"--out: cannot write {args.out} ({e.strerror or e})")
    print(f"{len(items)} items (first {args.warmup} warm-up) -> {args.out}; mix {mix_of(items[args.warmup :])}")
    return 0


def run_make_model(args: argparse.Namespace, prog: str) -> int:
    import subprocess

    from tailgate import servers

    try:
        Path(args.directory).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return usage_error(prog, f"cannot create {args.directory} ({e.strerror or e})")
    try:
        python = servers.ensure_vllm_venv()
    except servers.ServerError as e:
        return usage_error(prog, str(e))
    script = Path(servers.__file__).with_name("tinymodel.py")
    return subprocess.call([str(python), str(script), args.directory])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        load_plugins()  # now, so a plugin that cannot be imported is one line, before any parser is built
    except OptionError as e:
        return usage_error("tailgate", str(e))
    if argv and argv[0] == "report":
        from tailgate.postprocess.cli import main as report_main

        code: int = report_main(argv[1:])
        return code
    if argv and argv[0] == "selfcheck":
        from tailgate.verify.selfcheck import main as selfcheck_main

        return selfcheck_main(argv[1:])
    if argv and argv[0] == "slo":
        from tailgate.slo import main as slo_main

        return slo_main(argv[1:])
    if argv and argv[0] == "locust":
        # a fresh interpreter: Locust's gevent monkey-patching must come before anything opens a socket or thread
        os.execv(sys.executable, [sys.executable, "-m", "tailgate.locustcmd", *argv[1:]])
    parser = ArgumentParser(prog="tailgate", description="what does your batching policy do to tail latency?")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    p_suite = sub.add_parser("suite", help="run every cell of the experiment, then the report")
    add_suite_arguments(p_suite)
    sub.add_parser("report", help="table, charts, HTML report and diagnosis from a results folder")
    sub.add_parser("slo", help="highest Poisson rate meeting an SLO, per server configuration (scheduler sweep)")
    sub.add_parser("selfcheck", help="measure the load generator's own timing error against a ground-truth server")
    p_trace = sub.add_parser("trace", help="write the seeded trace as JSONL")
    add_options(p_trace, ("out", "n", "warmup", "seed"))
    p_model = sub.add_parser("make-model", help="build the tiny dummy-weight model folder")
    p_model.add_argument("directory")
    p_serve = sub.add_parser("serve", help="the CPU vLLM with the tiny model on a loopback port until Ctrl-C")
    add_serve_arguments(p_serve)
    sub.add_parser("locust", help="Locust with the suite's options loaded first: --help lists them, a missing -f "
                   "locustfile is one line (arguments as for locust)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "suite":
        return run_suite(args, "tailgate suite")
    if args.command == "trace":
        return run_trace(args, "tailgate trace")
    if args.command == "make-model":
        return run_make_model(args, "tailgate make-model")
    if args.command == "serve":
        return run_serve(args, "tailgate serve")
    return EXIT_USAGE


__all__ = ["EXIT_ERRORS", "EXIT_OK", "EXIT_USAGE", "main"]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
