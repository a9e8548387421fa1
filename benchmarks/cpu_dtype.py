"""What the CPU vLLM's weight type costs on this machine: prefill and decode per dtype, one request at a time.

Every CPU path of the suite (the embedded run, ``--server local``, the compose CPU stack) starts the tiny model
in bfloat16. Where the CPU has no bfloat16 instructions (``avx512_bf16`` or ``amx_bf16`` in its flags) PyTorch
emulates them, and the prefill, which is all matrix products, pays for it; the decode step of a tiny model is
mostly the engine's own loop and barely moves. The engine's shape (how long a 6,000-token prompt stalls the
streams beside it, against one decode step) is what the embedded run demonstrates, so this prints it for each
dtype on the machine at hand instead of assuming it.

    python benchmarks/cpu_dtype.py [--dtypes bfloat16,float32] [--repeat 3] [--all-cores]

Each dtype gets a fresh server placed as the embedded one is (every core but the load generator's; with
``--all-cores``, every core), then sequential streaming completions of 200, 1,000 and 6,000 prompt tokens
(``ignore_eos``): TTFT from the request's send, and the mean step between its content chunks. A minute or two
per dtype on 2 cores, most of it the server's start.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate.serverconfigs import EMBEDDED_BASE_FLAGS
from tailgate.servers import LocalVllmServer, ensure_tiny_model, ensure_vllm_venv

PROMPTS = ((200, 100), (1000, 50), (6000, 20))
"""(prompt tokens, output tokens): the seed mix's three prompt lengths, short outputs (the step is flat)."""
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def stream_once(base_url: str, model: str, prompt_tokens: int, max_tokens: int) -> tuple[float, float]:
    """One streaming completion: (TTFT ms from the send, mean ms between its content chunks)."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=300)
    body = json.dumps({"model": model, "prompt": "ocean " * prompt_tokens, "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True})  # fmt: skip
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise SystemExit(f"cpu_dtype: the server answered {response.status}: {response.read()[:200]!r}")
    stamps: list[float] = []
    while line := response.readline():
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            stamps.append(time.perf_counter())
    conn.close()
    if not stamps:
        raise SystemExit("cpu_dtype: a completion streamed no content")
    step = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    return (stamps[0] - start) * 1000.0, step * 1000.0


def measure(dtype: str, repeat: int, all_cores: bool) -> dict[int, tuple[list[float], list[float]]]:
    python = ensure_vllm_venv(log=lambda line: print(line, file=sys.stderr))
    model = ensure_tiny_model(python=python)
    server = LocalVllmServer(python, model, extra_args=[*EMBEDDED_BASE_FLAGS, "--dtype", dtype],
                             cpus=None if all_cores else "auto")  # fmt: skip
    out: dict[int, tuple[list[float], list[float]]] = {}
    with server:
        stream_once(server.base_url, "tiny-llama", 200, 4)  # the first request's one-off costs
        for prompt, tokens in PROMPTS:
            runs = [stream_once(server.base_url, "tiny-llama", prompt, tokens) for _ in range(repeat)]
            out[prompt] = ([r[0] for r in runs], [r[1] for r in runs])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated --dtype values")
    p.add_argument("--repeat", type=int, default=3, help="requests per prompt length")
    p.add_argument("--all-cores", action="store_true", help="the server on every core")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    flags = cpu_flags()
    native = [f for f in NATIVE_BF16 if f in flags]
    print(f"CPU: {len(flags)} flags; bfloat16 instructions: {', '.join(native) or 'none'}; "
          f"avx512f: {'yes' if 'avx512f' in flags else 'no'}")  # fmt: skip
    print("| dtype | prompt tokens | TTFT ms, median (each) | step ms, median |")
    print("|---|---:|---|---:|")
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        for prompt, (ttfts, steps) in measure(dtype, args.repeat, args.all_cores).items():
            each = ", ".join(f"{t:.0f}" for t in ttfts)
            ttft, step = statistics.median(ttfts), statistics.median(steps)
            print(f"| {dtype} | {prompt:,} | {ttft:.0f} ({each}) | {step:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
