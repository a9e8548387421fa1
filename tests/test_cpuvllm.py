"""Server control: exact commands (they go into run metadata), process-group cleanup, and one real server.

The integration test starts the CPU vLLM build twice (chunked prefill on, then off) because the whole
comparison rests on a restart really changing the policy and really leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tailgate.servers import (
    ComposeServer,
    ComposeSetupError,
    LocalVllmServer,
    ManualServer,
    ServerController,
    ServerError,
    default_vllm_python,
    ensure_tiny_model,
    ensure_vllm_venv,
    free_port,
    group_members,
    tailgate_home,
    vllm_server_argv,
)
from tailgate.servers.tinymodel import PROMPT_WORD, PROMPT_WORD_ID, model_config, tokenizer_config, vocabulary

PY = Path("/venv/bin/python")
MODEL = Path("/models/tiny")


# ----------------------------------------------------------------------------------------- local argv


def test_default_argv_is_exact() -> None:
    argv = vllm_server_argv(PY, MODEL, 8011, ["--max-num-batched-tokens", "2048"])
    assert argv == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
        "--served-model-name",
        "tiny-llama",
        "--load-format",
        "dummy",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "8192",
        "--no-enable-prefix-caching",
        "--host",
        "127.0.0.1",
        "--port",
        "8011",
        "--max-num-batched-tokens",
        "2048",
    ]


@pytest.mark.parametrize("extra", [["--max-model-len", "2048"], ["--max-model-len=2048"]])
def test_extra_max_model_len_replaces_default(extra: list[str]) -> None:
    argv = vllm_server_argv(PY, MODEL, 8011, extra)
    assert "8192" not in argv
    assert sum(a.startswith("--max-model-len") for a in argv) == 1
    assert argv[-len(extra) :] == extra


def test_prefix_caching_flag_replaces_its_opposite() -> None:
    argv = vllm_server_argv(PY, MODEL, 8011, ["--enable-prefix-caching"])
    assert "--no-enable-prefix-caching" not in argv
    assert argv[-1] == "--enable-prefix-caching"


@pytest.mark.parametrize("flag", ["--port", "--host", "--model", "--served-model-name"])
def test_owned_flags_are_refused(flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        vllm_server_argv(PY, MODEL, 8011, [flag, "x"])
    with pytest.raises(ValueError):
        LocalVllmServer(PY, MODEL, 8011, [f"{flag}=x"], log_path=Path("/tmp/unused.log"))


def test_local_server_facts_without_starting(tmp_path: Path) -> None:
    server = LocalVllmServer(
        PY, MODEL, 8123, ["--max-num-seqs", "8"], tmp_path / "v.log", served_model_name="m", env={"X_Y": "z"}
    )
    assert server.base_url == "http://127.0.0.1:8123"
    assert server.command == vllm_server_argv(PY, MODEL, 8123, ["--max-num-seqs", "8"], "m")
    assert server.pid is None
    assert not server.running
    env = server.environment()
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["X_Y"] == "z"
    facts = server.describe()
    assert facts["kind"] == "local-vllm"
    assert facts["command"] == server.command
    assert facts["env"]["X_Y"] == "z"
    json.dumps(facts)
    assert isinstance(server, ServerController)
    server.stop()  # never started: nothing to do
    server.stop()


def test_kv_cache_space_default_and_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert LocalVllmServer(PY, MODEL, 1, log_path=tmp_path / "a").environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"
    server = LocalVllmServer(PY, MODEL, 1, log_path=tmp_path / "a", env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert server.environment()["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_home_and_python_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGATE_HOME", str(tmp_path))
    monkeypatch.delenv("TAILGATE_VLLM_PYTHON", raising=False)
    assert tailgate_home() == tmp_path
    assert default_vllm_python() == tmp_path / "vllm-venv" / "bin" / "python"
    monkeypatch.setenv("TAILGATE_VLLM_PYTHON", "/elsewhere/python")
    assert default_vllm_python() == Path("/elsewhere/python")


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_python_override_must_import_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _fake_python(tmp_path, "exit 0\n")
    monkeypatch.setenv("TAILGATE_VLLM_PYTHON", str(good))
    assert ensure_vllm_venv(tmp_path / "home", log=pytest.fail) == good
    bad = tmp_path / "bad-python"
    bad.write_text("#!/bin/sh\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("TAILGATE_VLLM_PYTHON", str(bad))
    with pytest.raises(ServerError, match="cannot import vllm"):
        ensure_vllm_venv(tmp_path / "home", log=pytest.fail)


def test_existing_venv_is_reused_without_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAILGATE_VLLM_PYTHON", raising=False)
    bindir = tmp_path / "vllm-venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").symlink_to(_fake_python(tmp_path, "exit 0\n"))
    assert ensure_vllm_venv(tmp_path, log=pytest.fail) == bindir / "python"


def test_existing_tiny_model_is_reused(tmp_path: Path) -> None:
    (tmp_path / "tiny-model").mkdir()
    (tmp_path / "tiny-model" / "config.json").write_text("{}")
    assert ensure_tiny_model(tmp_path, python=tmp_path / "never-run") == tmp_path / "tiny-model"


def test_tiny_model_vocabulary_and_config() -> None:
    vocab = vocabulary()
    assert sorted(vocab.values()) == list(range(1024))
    assert vocab[PROMPT_WORD] == PROMPT_WORD_ID
    assert all(" " not in token for token in vocab)
    config = model_config()
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["vocab_size"] == len(vocab)
    assert config["bos_token_id"] == vocab["<s>"] and config["eos_token_id"] == vocab["</s>"]
    tok = tokenizer_config()
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok["add_bos_token"] is False  # otherwise "ocean " * n would be n + 1 prompt tokens


# ----------------------------------------------------------------------------------------- process group


def _fake_python(tmp_path: Path, body: str) -> Path:
    """A stand-in interpreter: the server object only ever runs it with vLLM's arguments."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def test_exit_before_healthy_reports_log_tail(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "engine died: bad flag"\nexit 3\n')
    server = LocalVllmServer(python, tmp_path, free_port(), log_path=tmp_path / "s.log")
    server.start()
    with pytest.raises(ServerError, match=r"(?s)exited with code 3.*engine died: bad flag"):
        server.wait_healthy(timeout=20)
    server.stop()
    assert "==== tailgate: starting" in server.log_text()


def test_stop_reaps_the_whole_group_even_after_kill_9(tmp_path: Path) -> None:
    # The "engine" child outlives its parent, as vLLM's engine core would after the API server is killed.
    python = _fake_python(tmp_path, "sleep 300 &\nexec sleep 300\n")
    server = LocalVllmServer(python, tmp_path, free_port(), log_path=tmp_path / "s.log")
    server.start()
    pid = server.pid
    assert pid is not None
    deadline = time.monotonic() + 10
    while len(group_members(pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(pid)) == 2
    os.kill(pid, signal.SIGKILL)
    server.stop(timeout=5)
    assert group_members(pid) == []
    assert not server.running
    server.stop()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "trap '' TERM\nwhile :; do sleep 0.1; done\n")
    server = LocalVllmServer(python, tmp_path, free_port(), log_path=tmp_path / "s.log")
    server.start()
    pid = server.pid
    assert pid is not None
    time.sleep(0.3)
    t0 = time.monotonic()
    server.stop(timeout=1)
    assert time.monotonic() - t0 < 10
    assert group_members(pid) == []


def test_restart_replaces_flags_and_keeps_old_log(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "args: $*"\nexec sleep 300\n')
    server = LocalVllmServer(python, tmp_path, free_port(), ["--a", "1"], tmp_path / "s.log")
    server.start()
    with pytest.raises(ServerError, match="already running"):
        server.start()
    server.restart(["--b", "2"])
    assert server.extra_args == ["--b", "2"]
    assert server.command[-2:] == ["--b", "2"]
    deadline = time.monotonic() + 10
    while "args:" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop()
    assert "--b 2" in server.log_text() and "--a 1" not in server.log_text()
    assert "--a 1" in server.log_text(current_only=False)


# ----------------------------------------------------------------------------------------- compose


class FakeRunner:
    """Records compose/docker invocations and answers from a table of canned results."""

    def __init__(self, answers: Mapping[str, tuple[int, str]] | None = None) -> None:
        self.calls: list[tuple[list[str], dict[str, str] | None]] = []
        self.answers = dict(answers or {})

    def __call__(self, argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        self.calls.append((list(argv), dict(env) if env is not None else None))
        for key, (code, out) in self.answers.items():
            if key in " ".join(argv):
                return subprocess.CompletedProcess(list(argv), code, out, "boom" if code else "")
        return subprocess.CompletedProcess(list(argv), 0, "", "")


def test_compose_up_and_stop_commands() -> None:
    runner = FakeRunner()
    server = ComposeServer(
        "vllm",
        ["deploy/compose.yaml"],
        chunked_off_files=["deploy/compose.chunked-off.yaml"],
        project_directory="/srv",
        project_name="tg",
        runner=runner,
    )
    assert isinstance(server, ServerController)
    server.start(["--max-num-batched-tokens", "8192"])
    base = ["docker", "compose", "--project-directory", "/srv", "-p", "tg", "-f", "deploy/compose.yaml"]
    assert runner.calls[-1] == ([*base, "up", "-d", "vllm"], {"TAILGATE_VLLM_ARGS": "--max-num-batched-tokens 8192"})
    server.restart(["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"])
    off = [*base, "-f", "deploy/compose.chunked-off.yaml"]
    assert runner.calls[-2][0] == [*off, "stop", "vllm"]
    assert runner.calls[-1] == ([*off, "up", "-d", "vllm"], {"TAILGATE_VLLM_ARGS": "--max-num-batched-tokens 8192"})
    assert server.describe()["command"] == [*off, "up", "-d", "vllm"]


def test_compose_chunked_off_by_service_name_stops_both() -> None:
    runner = FakeRunner()
    server = ComposeServer("vllm-on", chunked_off_service="vllm-off", runner=runner)
    server.start([])
    assert runner.calls[-1][0] == ["docker", "compose", "up", "-d", "vllm-on"]
    server.restart(["--no-enable-chunked-prefill"])
    assert runner.calls[-2][0] == ["docker", "compose", "stop", "vllm-on", "vllm-off"]
    assert runner.calls[-1] == (["docker", "compose", "up", "-d", "vllm-off"], {"TAILGATE_VLLM_ARGS": ""})


def test_compose_without_chunked_off_variant_refuses() -> None:
    server = ComposeServer("vllm", runner=FakeRunner())
    with pytest.raises(ValueError, match="chunked_off"):
        server.start(["--no-enable-chunked-prefill"])


def test_compose_failure_raises_with_stderr() -> None:
    server = ComposeServer("vllm", runner=FakeRunner({"up -d": (1, "")}))
    with pytest.raises(ServerError, match="boom"):
        server.start()


def test_compose_describe_reports_image_and_digest() -> None:
    config = json.dumps({"services": {"vllm": {
        "image": "vllm/vllm-openai:v0.24.0", "entrypoint": ["vllm", "serve"],
        "command": ["--model", "m", "--no-enable-chunked-prefill", "--api-key", "sk-in-the-file"],
        "environment": {"VLLM_API_KEY": "sk-interpolated", "HF_TOKEN": "hf-secret"}}}})  # fmt: skip
    inspect = json.dumps([{"Id": "sha256:abc", "RepoDigests": ["vllm/vllm-openai@sha256:def"]}])
    runner = FakeRunner({"config --format json": (0, config), "image inspect": (0, inspect)})
    server = ComposeServer("vllm", ["c.yaml"], base_url="http://127.0.0.1:1", runner=runner)
    facts = server.describe()
    assert facts["image"] == "vllm/vllm-openai:v0.24.0"
    # what the container runs, as compose resolved it; secrets in it are not recorded
    assert facts["effective_command"] == [
        "vllm", "serve", "--model", "m", "--no-enable-chunked-prefill", "--api-key", "<redacted>"
    ]  # fmt: skip
    assert "secret" not in json.dumps(facts) and "sk-" not in json.dumps(facts)
    assert facts["image_id"] == "sha256:abc"
    assert facts["repo_digests"] == ["vllm/vllm-openai@sha256:def"]
    assert ["docker", "image", "inspect", "vllm/vllm-openai:v0.24.0"] in [c[0] for c in runner.calls]
    json.dumps(facts)


def test_compose_describe_reads_the_running_container() -> None:
    """The command recorded is the one the container runs (docker inspect), not the files' one."""
    files = json.dumps({"services": {"vllm": {"image": "img:file", "command": ["--model", "from-the-file"]}}})
    container = json.dumps([{
        "Id": "c0ffee", "Name": "/tailgate-vllm-1", "Image": "sha256:live", "Path": "/opt/venv/bin/python",
        "Args": ["-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--api-key", "sk-live"],
        "Config": {"Image": "img:live", "Env": ["VLLM_API_KEY=sk-env"]}, "State": {"StartedAt": "t0"}}])  # fmt: skip
    runner = FakeRunner({"ps -q --status running vllm": (0, "c0ffee\n"), "docker inspect c0ffee": (0, container),
                         "config --format json": (0, files)})  # fmt: skip
    facts = ComposeServer("vllm", ["c.yaml"], base_url="http://127.0.0.1:1", runner=runner).describe()
    assert facts["effective_command_from"] == "docker inspect"
    assert facts["effective_command"] == [
        "/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--api-key", "<redacted>"
    ]  # fmt: skip
    assert (facts["image"], facts["image_id"], facts["container"]["id"]) == ("img:live", "sha256:live", "c0ffee")
    assert "sk-" not in json.dumps(facts) and "from-the-file" not in json.dumps(facts)


def _compose_config(service: dict[str, Any]) -> str:
    return json.dumps({"services": {"vllm": service}})


def test_compose_preflight_engine_not_running() -> None:
    runner = FakeRunner({"docker info": (1, "")})
    with pytest.raises(ComposeSetupError, match=r"engine is not running.*boom"):
        ComposeServer("vllm", ["c.yaml"], runner=runner).preflight()
    assert [c[0][:2] for c in runner.calls] == [["docker", "info"]]  # nothing else was tried


def test_compose_preflight_without_docker() -> None:
    def no_docker(argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory")

    with pytest.raises(ComposeSetupError, match="install Docker"):
        ComposeServer("vllm", runner=no_docker).preflight()


def test_compose_preflight_missing_local_image() -> None:
    config = _compose_config({"image": "tailgate/vllm-cpu:local", "pull_policy": "never"})
    runner = FakeRunner({"config --format json": (0, config), "image inspect": (1, "")})
    with pytest.raises(ComposeSetupError, match=r"tailgate/vllm-cpu:local \(service vllm\) is not on this machine"):
        ComposeServer("vllm", ["c.yaml"], runner=runner).preflight()
    # an image compose may pull (the GPU file's) is not required to be here already
    pulled = FakeRunner({"config --format json": (0, _compose_config({"image": "vllm/vllm-openai:v0.24.0"})),
                         "image inspect": (1, "")})  # fmt: skip
    ComposeServer("vllm", ["c.yaml"], base_url=f"http://127.0.0.1:{free_port()}", runner=pulled).preflight()


def test_compose_preflight_port_taken_unless_the_service_holds_it() -> None:
    import socket

    config = _compose_config({"image": "img", "network_mode": "host"})
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        url = f"http://127.0.0.1:{holder.getsockname()[1]}"
        runner = FakeRunner({"config --format json": (0, config)})
        with pytest.raises(ComposeSetupError, match="is taken by another process"):
            ComposeServer("vllm", ["c.yaml"], base_url=url, runner=runner).preflight()
        # the service's own running container holds it: that is the server to re-create, not a conflict
        ours = FakeRunner({"config --format json": (0, config), "ps -q": (0, "abc\n"),
                           "docker inspect abc": (0, json.dumps([{"Id": "abc"}]))})  # fmt: skip
        ComposeServer("vllm", ["c.yaml"], base_url=url, runner=ours).preflight()


def test_compose_preflight_unknown_service() -> None:
    runner = FakeRunner({"config --format json": (0, json.dumps({"services": {"other": {}}}))})
    with pytest.raises(ComposeSetupError, match="has no service 'vllm'"):
        ComposeServer("vllm", ["c.yaml"], runner=runner).preflight()


def test_compose_describe_survives_missing_docker() -> None:
    def no_docker(argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("docker")

    facts = ComposeServer("vllm", base_url="http://127.0.0.1:1", runner=no_docker).describe()
    assert facts["image"] is None and facts["service"] == "vllm"


# ----------------------------------------------------------------------------------------- manual


class _Stub(BaseHTTPRequestHandler):
    """/health and /metrics with a process start time the test can change (a quick restart)."""

    start_time = 100.0
    healthy = True

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200 if _Stub.healthy else 503)
            self.end_headers()
        elif self.path == "/metrics":
            body = f"process_start_time_seconds {_Stub.start_time}\n".encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def stub_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Stub.start_time, _Stub.healthy = 100.0, True
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_manual_restart_detects_new_process_without_stdin(stub_server: str) -> None:
    said: list[str] = []

    def no_input(prompt: str) -> str:
        raise AssertionError("stdin must not be read when not interactive")

    server = ManualServer(stub_server, out=said.append, interactive=False, input_fn=no_input, poll=0.05, timeout=10)
    timer = threading.Timer(0.3, lambda: setattr(_Stub, "start_time", 200.0))
    timer.start()
    server.restart(["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"])
    timer.join()
    assert any("--no-enable-chunked-prefill --max-num-batched-tokens 8192" in s for s in said)
    assert server.describe()["requested_args"] == ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]
    server.stop()


def test_manual_restart_detects_down_then_up(stub_server: str) -> None:
    server = ManualServer(stub_server, out=lambda s: None, interactive=False, poll=0.05, timeout=10)

    def bounce() -> None:
        _Stub.healthy = False
        time.sleep(0.3)
        _Stub.healthy = True

    timer = threading.Timer(0.2, bounce)
    timer.start()
    t0 = time.monotonic()
    server.restart([])
    timer.join()
    assert time.monotonic() - t0 >= 0.4


def test_manual_start_when_up_returns(stub_server: str) -> None:
    said: list[str] = []
    ManualServer(stub_server, out=said.append, interactive=False, poll=0.05, timeout=5).start([])
    assert said and "Start" in said[0]


# ----------------------------------------------------------------------------------------- real vLLM


def _post(url: str, payload: dict[str, Any], timeout: float = 120.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _stream_tokens(base_url: str, model: str, max_tokens: int) -> tuple[int, int]:
    """(content chunks, completion tokens from the final usage chunk) of one streamed completion."""
    payload = {
        "model": model,
        "prompt": "ocean " * 20,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        base_url + "/v1/completions", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    chunks, usage_tokens = 0, -1
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if event["choices"]:
                chunks += 1
            if event.get("usage"):
                usage_tokens = event["usage"]["completion_tokens"]
    return chunks, usage_tokens


_VLLM_PYTHON = default_vllm_python()


@pytest.mark.vllm
@pytest.mark.skipif(
    not _VLLM_PYTHON.exists(),
    reason=f"no vLLM interpreter at {_VLLM_PYTHON}: set TAILGATE_VLLM_PYTHON or run ensure_vllm_venv()",
)
def test_real_server_start_restart_stop(tmp_path: Path) -> None:
    model = ensure_tiny_model(tmp_path, _VLLM_PYTHON)
    server = LocalVllmServer(
        _VLLM_PYTHON, model, free_port(), ["--max-num-batched-tokens", "2048", "--enforce-eager"], tmp_path / "vllm.log"
    )
    try:
        server.start()
        first_start = server.wait_healthy(timeout=480)
        print(f"first start healthy after {first_start} s")
        base = server.base_url
        with urllib.request.urlopen(base + "/health", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(base + "/v1/models", timeout=5) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["tiny-llama"]
        tokens = _post(base + "/tokenize", {"model": "tiny-llama", "prompt": "ocean " * 50})
        assert tokens["count"] == 50
        assert len(tokens["tokens"]) == 50
        chunks, tokens_used = _stream_tokens(base, "tiny-llama", 8)
        # a loaded server may put several tokens in one SSE chunk: the usage count is the token count
        assert tokens_used == 8 and 1 <= chunks <= 8
        assert "enable_chunked_prefill=True" in server.log_text()
        assert server.describe()["vllm_version"] == "0.32.0"

        server.restart(["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192", "--enforce-eager"])
        second_start = server.wait_healthy(timeout=480)
        print(f"restart healthy after {second_start} s")
        log = server.log_text()
        assert "'enable_chunked_prefill': False" in log  # the API server's "non-default args" line
        assert "enable_chunked_prefill=False" in log  # the engine's "Initializing a V1 LLM engine" line
        assert "enable_chunked_prefill=True" not in log
        assert "--no-enable-chunked-prefill" in server.command
        chunks, tokens_used = _stream_tokens(base, "tiny-llama", 8)
        # a loaded server may put several tokens in one SSE chunk: the usage count is the token count
        assert tokens_used == 8 and 1 <= chunks <= 8
    finally:
        pid = server.pid
        server.stop()
    assert pid is not None
    assert not server.running
    assert group_members(pid) == []
    server.stop()


def test_suite_compose_controller_switches_file_sets_per_configuration() -> None:
    from tailgate.servers import ComposeByConfig

    runner = FakeRunner()
    files = {"chunked": [], "nochunk": ["docker-compose.nochunk.yml"], "preempt": ["docker-compose.preempt.yml"]}
    controller = ComposeByConfig(
        {c: ComposeServer("vllm", ["docker-compose.yml", *extra], runner=runner) for c, extra in files.items()}
    )
    for config, extra in files.items():
        controller.use_config(config)
        controller.restart(["--ignored"])
        argv, env = runner.calls[-1]
        assert argv == ["docker", "compose", "-f", "docker-compose.yml", *[a for f in extra for a in ("-f", f)],
                        "up", "-d", "vllm"]  # fmt: skip
        assert not (env or {}).get("TAILGATE_VLLM_ARGS")
