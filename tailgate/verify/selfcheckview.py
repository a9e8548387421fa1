"""The self-check's table as a reader meets it: one run's figures, its two schedules, its bounds and verdict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tailgate.clientbound import merged_breached
from tailgate.hoststeal import NOTABLE_SHARE
from tailgate.verify.cpusplit import cpu_ranges
from tailgate.verify.hostheld import held_line
from tailgate.verify.lateness import SERVER_LATE


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def render(result: Mapping[str, Any]) -> str:
    """The human-readable table of one self-check."""
    c = result["config"]
    jn = result["join"]
    m0, m1 = result["machine"]["before"], result["machine"]["after"]
    cpu = result.get("cpu") or {}
    processes = result.get("load_processes", c["processes"])
    hosts = c.get("hosts", 1)
    truth = result.get("truth_server") or {}
    lines = [
        f"tailgate selfcheck: {c['rate']:g} req/s, {c['n']} requests x {c['tokens']} tokens, gap {c['gap_ms']:g} ms, "
        f"TTFT {c['ttft_ms']:g} ms, {processes} load process(es)"
        + (" (auto)" if c["processes"] == 0 else "")
        + (f" over {hosts} load hosts (network namespaces)" if hosts > 1 else "")
        + (
            f"; reference server: {truth['workers']} worker(s)" + (" (auto)" if truth.get("auto") else "")
            if truth
            else ""
        ),
        f"machine: {m0['cores']} cores, load average {m0['loadavg_1m']:.2f} before / {m1['loadavg_1m']:.2f} after"
        + (
            f"; {cpu['machine_busy_cores']:.2f} cores busy during the stage, "
            f"{max(0.0, cpu['others_busy_cores']):.2f} of them other processes, "
            f"{cpu.get('host_steal_share', 0.0):.0%} of the CPU time stolen by the host"
            if cpu
            else ""
        ),
        *(
            [f"cpus: reference server on {cpu_ranges(split['reference'])}, load on {cpu_ranges(split['load'])}"]
            if (split := result.get("cpu_split"))
            else []
        ),
        f"join: {jn['matched_requests']}/{jn['requests']} requests, {jn['matched_chunks']}/{jn['client_chunks']} "
        f"client chunks matched to {jn['server_chunks']} server writes, {jn['failed']} failed, "
        f"{jn['unclaimed_server_requests']} unclaimed server streams: {'exact' if jn['exact'] else 'NOT exact'}",
    ]
    acc = result.get("accounting")
    if acc:
        lines.append(
            f"accounting: {acc['planned']} planned, {acc['sent']} sent, {acc['recorded']} recorded "
            f"({acc['errors']} errors), {acc['lost_in_flight']} lost in flight, {acc['never_sent']} never sent"
        )
    lines += [
        "",
        f"{'ms':<40}{'n':>8}{'min':>10}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}",
    ]
    rows = (
        ("client-added error per chunk", "chunk_error_ms"),
        ("  the same vs write begin (upper bound)", "chunk_error_begin_ms"),
        ("TTFT error (client - true)", "ttft_error_ms"),
        ("worst-gap error (client - true)", "worst_gap_error_ms"),
        ("  beyond the server's write calls", "worst_gap_beyond_write_ms"),
        ("schedule lag (sent - intended)", "schedule_lag_ms"),
        ("true TTFT (server 1st write - send)", "true_ttft_ms"),
        ("true worst gap (server writes)", "true_worst_gap_ms"),
        ("upload (server received - send)", "upload_ms"),
        ("server write lateness (write - target)", "server_write_lateness_ms"),
    )
    for label, key in rows:
        d = result[key]
        lines.append(
            f"{label:<40}{d['n']:>8}{_fmt(d['min']):>10}{_fmt(d['p50']):>10}{_fmt(d['p99']):>10}"
            f"{_fmt(d['p99.9']):>10}{_fmt(d['max']):>10}"
        )
    for mode, figures in (result.get("by_stamp") or {}).items():
        used = " (used)" if mode == result.get("chunk_stamp") else ""
        for key, label in (("chunk_error_ms", "chunk"), ("gap_error_ms", "worst gap")):
            d = figures[key]
            if d["n"]:
                text = f"  {label} error, {mode} stamp{used}"
                lines.append(
                    f"{text:<40}{d['n']:>8}{_fmt(d['min']):>10}{_fmt(d['p50']):>10}{_fmt(d['p99']):>10}"
                    f"{_fmt(d['p99.9']):>10}{_fmt(d['max']):>10}"
                )
    ks = result["interarrival_ks"]
    lines += [
        "",
        f"inter-arrival KS vs Exp({ks['rate']:g}/s): D={ks['statistic']:.4f}, n={ks['n']}, p={ks['p_value']:.3f} "
        f"({'pass' if ks['passed'] else 'FAIL'} at alpha {ks['alpha']:g})",
    ]
    if cpu:
        per_chunk = cpu.get("load_us_per_chunk")
        lines.append(
            f"load generator CPU: {100 * cpu['load_cores']:.1f}% of one core over the {cpu['wall_s']:.1f} s stage "
            f"({_fmt(per_chunk) if per_chunk is None else f'{per_chunk:.1f}'} us per chunk, "
            f"{result['chunks_per_s']:.0f} chunks/s); server {100 * cpu['server_cores']:.1f}%"
        )
    cap = result.get("capture")
    if cap:
        lines.append(
            f"packet capture: {cap['drops']} segment(s) dropped, {cap['missed_streams']} stream(s) it could not "
            f"account for (kept kernel stamps); stamps used: "
            + ", ".join(f"{k} {v}" for k, v in (result.get("chunk_stamps") or {}).items())
        )
    for note in result.get("stamp_notes") or ():
        lines.append(f"stamp: {note}")
    merged = result.get("client_coalesced_streams")
    steal = cpu.get("host_steal_share")
    if merged_breached(merged):
        lines.append(
            f"CLIENT BEHIND: {merged} stream(s) merged chunks in late reads (client_coalesced): "
            "their gaps describe the load generator"
        )
    if steal is not None and steal >= NOTABLE_SHARE:
        lines.append(
            f"HOST STEAL: the hypervisor held back {steal:.0%} of this machine's CPU time during the stage; "
            "every process here was paused meanwhile, so late reads are the host's as much as the client's: "
            "measure again on a quieter host"
        )
    # the held CPUs explain a late client; a late reference alone is no reason to blame the client
    client_bad = any(b["breached"] for b in result.get("bounds") or () if b["key"] != SERVER_LATE.key)
    held_text = held_line(result.get("host_held"), client_late=client_bad or bool(merged))
    if held_text:
        lines.append(held_text)
    if truth.get("workers_lost"):
        lines.append(f"reference server: worker(s) ended before the end, their streams are missing: "
                     f"{truth['workers_lost']}")  # fmt: skip
    capacity = result.get("capacity")
    if capacity and (c["processes"] == 0 or truth.get("auto")):
        lines.append(f"auto: {capacity['line']}")
    lines.append(
        f"locust: exit {result['locust']['exit_code']}, {result['locust']['cpu_s_total']:.2f} s CPU in all "
        f"(start-up included), {result['locust']['wall_s']:.1f} s wall"
    )
    for problem in jn["problems"][:5]:
        lines.append(f"problem: {problem}")
    lines += [f"bound: {b['text']}" for b in result.get("bounds") or ()]
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


__all__ = ["render"]
