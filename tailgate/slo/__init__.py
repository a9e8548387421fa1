"""``tailgate slo``: the highest Poisson rate each server configuration sustains under an SLO.

The question after the seed's table: *at my SLO, how much load can this server take, and which
scheduler setting gives the most?* For every server configuration of a sweep (chunked prefill,
``--max-num-batched-tokens``, ``--long-prefill-token-threshold``, ``--max-num-seqs``), the server is
restarted with its flags and the continuous arm probes rates: double from a start rate until the
SLO fails, then bisect to a resolution. Every probe is an ordinary Locust run in its own folder
(nothing is discarded, and ``tailgate report`` reads them like any other cell).

An SLO limits TTFT, worst-gap and total percentiles **from the intended send** (so a late load
generator or a queue in front of the server counts against the server, as a user would feel it),
and the error rate. A probe lasts long enough to hold steady state and passes only if the server
kept up (completions tracked arrivals, no upward trend in TTFT or the queue) and every limit holds by
a distribution-free bound whose counts are shrunk for correlated requests; otherwise it fails or has
*not enough data*, which is re-run with the same workload and never counts as a pass.

This module drives child processes and reads JSONL; it never imports pandas, gevent or Locust.
"""

from tailgate.serverconfigs import EMBEDDED_BASE_FLAGS
from tailgate.slo.answer import print_table
from tailgate.slo.attempt import ProbeAttempt, ProbeMark
from tailgate.slo.command import (
    EMBEDDED,
    GPU,
    add_slo_arguments,
    build_plan,
    main,
    run,
)
from tailgate.slo.plan import PROBE_OVERHEAD_S, SloPlan
from tailgate.slo.pooled import isotonic_blocks, pooled_verdicts
from tailgate.slo.probe import SloRunError, SloRunner, probe_dir_name
from tailgate.slo.search import (
    ProbeNext,
    Resolution,
    SearchEnds,
    SearchOutcome,
    SearchStep,
    SearchStopped,
    bracket,
    next_probe,
    search,
)
from tailgate.slo.spec import (
    EMBEDDED_MAX_MODEL_LEN,
    EXIT_FAILED,
    EXIT_NOT_MET,
    EXIT_OK,
    EXIT_USAGE,
    KNOBS,
    METRIC_FIELDS,
    PROBE_MARK,
    SLO_FILE,
    Limit,
    ServerConfig,
    SloError,
    build_sweep,
    knob_flags,
    parse_config,
    parse_grid,
    parse_slo,
    parse_sweep_file,
    slo_text,
)
from tailgate.slo.verdict import Check, Sustain, binding_limit, check_probe, error_check, mser5_cut, p99s, sustain_check

__all__ = [
    "EMBEDDED",
    "EMBEDDED_BASE_FLAGS",
    "EMBEDDED_MAX_MODEL_LEN",
    "EXIT_FAILED",
    "EXIT_NOT_MET",
    "EXIT_OK",
    "EXIT_USAGE",
    "GPU",
    "KNOBS",
    "METRIC_FIELDS",
    "PROBE_MARK",
    "PROBE_OVERHEAD_S",
    "SLO_FILE",
    "Check",
    "Limit",
    "ProbeAttempt",
    "ProbeMark",
    "ProbeNext",
    "Resolution",
    "SearchEnds",
    "SearchOutcome",
    "SearchStep",
    "SearchStopped",
    "ServerConfig",
    "SloError",
    "SloPlan",
    "SloRunError",
    "SloRunner",
    "Sustain",
    "add_slo_arguments",
    "binding_limit",
    "bracket",
    "build_plan",
    "build_sweep",
    "check_probe",
    "error_check",
    "isotonic_blocks",
    "knob_flags",
    "main",
    "mser5_cut",
    "next_probe",
    "p99s",
    "parse_config",
    "parse_grid",
    "parse_slo",
    "parse_sweep_file",
    "pooled_verdicts",
    "print_table",
    "probe_dir_name",
    "run",
    "search",
    "slo_text",
    "sustain_check",
]
