"""The server configurations the suite compares, each declared once with everything that depends on it.

A configuration is a way to start the same vLLM: the engine default (chunked prefill on), chunked prefill
off, and a small KV pool that forces preemption. The suite runs its cells on each, restarting the server
between them; the analysis asks a configuration what role it plays in the comparison (which side of chunked
prefill on vs off, whether it exists to preempt) rather than matching its name. A new configuration is an
entry here, its option pair in ``tailgate/suitecommand.py`` and, for compose, an override file.

Pure Python, no flags of vLLM beyond strings: the suite, the servers and the analysis all read it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

CHUNKED_OFF_FLAG = "--no-enable-chunked-prefill"
"""The vLLM flag that switches chunked prefill off: the policy the suite compares."""

EMBEDDED_BASE_FLAGS = ["--enforce-eager"]
"""Eager mode: the CPU server starts in ~40 s instead of ~100 s of torch.compile on 2 cores; the embedded
run demonstrates the mechanisms, it does not benchmark the CPU backend."""
EMBEDDED_PREEMPT_FLAGS = ["--max-model-len", "7200", "--num-gpu-blocks-override", "58"]
"""A 6000-token prompt plus its 600 tokens needs 52 blocks of 128 on the CPU backend. 64 blocks never preempted
(KV use peaked ~78%); 58 is the smallest pool that holds 7200 tokens of context (one block is reserved), and
7200 still leaves the 5 characters per token vLLM checks prompts by (6000 x "ocean " = 36,000). With it the
seed's 45 requests at 2 req/s preempt several times (the counter rose by 9 in the cell here)."""
EMBEDDED_NOCHUNK_FLAGS = [CHUNKED_OFF_FLAG, "--max-num-batched-tokens", "8192"]
"""Unchunked prompts must fit one step: the CPU default budget (2048) is below the context."""
GPU_NOCHUNK_FLAGS = [CHUNKED_OFF_FLAG]
GPU_PREEMPT_FLAGS = ["--max-model-len", "8192", "--num-gpu-blocks-override", "4000"]
"""16-token GPU blocks: 4000 blocks = 64,000 KV tokens preempted without a queue collapse on an H200 at
10 req/s (results/h200); 1500 blocks (24,000 tokens) collapsed the queue."""


@dataclass(frozen=True)
class ServerConfiguration:
    """One way the suite starts the server, and what the rest of the suite needs to know of it."""

    name: str
    label: str
    """How the report's charts name it."""
    color: str
    """Its colour in every chart, so a configuration reads the same across charts and reports."""
    gpu_flags: tuple[str, ...]
    """vLLM flags a restart gives it on a GPU server (a user's ``--<name>-flags`` replaces them)."""
    embedded_flags: tuple[str, ...]
    """The same on the embedded CPU server, whose context and KV pool are smaller."""
    plan_flags: tuple[str, ...]
    """The flags a suite plan built without options carries (its programmatic default)."""
    flags_option: str | None
    """``argparse`` dest of the option that replaces its flags; None: it runs the engine default."""
    compose_file_option: str | None
    """``argparse`` dest of the compose override file that gives it its flags; None: the base files alone."""
    chunked_prefill: bool
    """Whether chunked prefill is on: the two sides of the on/off comparison at the same rate."""
    preempts: bool
    """It exists to force preemption: its seconds-long stalls are shown apart, never beside the on/off
    comparison."""
    engine_default: bool
    """vLLM's own defaults: the rate ramp (and its knee) and the gated arm run here, and a run that names no
    configuration was this one."""
    marker: str = "^"
    line: str = "-."
    """Marker and line style of its series on the rate charts."""


CHUNKED = ServerConfiguration(
    "chunked", "chunked prefill on (engine default)", "#1f77b4", (), (), (), None, None,
    chunked_prefill=True, preempts=False, engine_default=True, marker="o", line="-",
)  # fmt: skip
NOCHUNK = ServerConfiguration(
    "nochunk", "chunked prefill off", "#d62728", tuple(GPU_NOCHUNK_FLAGS), tuple(EMBEDDED_NOCHUNK_FLAGS),
    (CHUNKED_OFF_FLAG,), "nochunk_flags", "nochunk_compose_file",
    chunked_prefill=False, preempts=False, engine_default=False, marker="s", line="--",
)  # fmt: skip
PREEMPT = ServerConfiguration(
    "preempt", "small KV pool (preemption)", "#9467bd", tuple(GPU_PREEMPT_FLAGS), tuple(EMBEDDED_PREEMPT_FLAGS),
    (), "preempt_flags", "preempt_compose_file",
    chunked_prefill=True, preempts=True, engine_default=False,
)  # fmt: skip

CONFIGS: dict[str, ServerConfiguration] = {c.name: c for c in (CHUNKED, NOCHUNK, PREEMPT)}
"""In the order the suite runs them (fewest restarts: the default first) and the report lists them."""
DEFAULT = CHUNKED
"""The configuration of a run that names none: vLLM runs chunked prefill unless told otherwise."""
CHUNKED_PAIR = (CHUNKED, NOCHUNK)
"""The on/off pair the diagnosis, the decision rate and the prompt A/B compare at the same rate."""


def configuration(name: object) -> ServerConfiguration | None:
    """The registered configuration of this name; None for a user's own label (a run's ``--config-label``)."""
    return CONFIGS.get(name) if isinstance(name, str) else None


def preempting(name: object) -> bool:
    """A cell of this configuration is there to preempt (unknown labels are not)."""
    c = configuration(name)
    return c is not None and c.preempts


def engine_default(name: object) -> bool:
    """A cell of this configuration runs vLLM's defaults: the ramp's (unknown labels do not)."""
    c = configuration(name)
    return c is not None and c.engine_default


def server_flags(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each configuration's flags: the user's ``--<name>-flags`` when given, else the registry's for this server
    (``--embedded``: the CPU server's, after its base flags)."""
    base = EMBEDDED_BASE_FLAGS if args.embedded else []
    out: dict[str, list[str]] = {}
    for config in CONFIGS.values():
        given = getattr(args, config.flags_option, "") if config.flags_option else ""
        default = config.embedded_flags if args.embedded else config.gpu_flags
        out[config.name] = [*base, *(given.split() if given else default)]
    return out


def declared_flags(args: argparse.Namespace) -> dict[str, list[str]]:
    """The flags the user gave per configuration: applied by a server the suite restarts, recorded as declared
    for one it does not, refused for one whose flags live in files."""
    given = {c.name: getattr(args, c.flags_option, "") for c in CONFIGS.values() if c.flags_option}
    return {name: text.split() for name, text in given.items() if text}


def option_text(dest: str | None) -> str:
    """``nochunk_flags`` -> ``--nochunk-flags``: an option as the user types it."""
    return "--" + str(dest).replace("_", "-")


def names_text() -> str:
    """``chunked, nochunk, preempt``: the known names, as option help and error lines list them."""
    return ", ".join(CONFIGS)
