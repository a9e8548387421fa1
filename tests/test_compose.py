"""Static checks of the deployment files: compose, Prometheus, Grafana and the environment template.

No Docker engine is needed: the files are parsed and their properties checked. Where a tool that can
validate a file more deeply is installed (promtool), it is used too; otherwise those checks skip.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
NOCHUNK = ROOT / "docker-compose.nochunk.yml"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DATASOURCE = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASH_PROVIDER = GRAFANA / "provisioning" / "dashboards" / "tailgate.yml"
DASHBOARD = GRAFANA / "dashboards" / "tailgate.json"
ENV_EXAMPLE = ROOT / ".env.example"
VLLM_METRICS = ROOT / "tests" / "fixtures" / "vllm-metrics.txt"
"""vLLM's documented metric names, vendored: tests read nothing outside the repository."""

VLLM_IMAGE = "vllm/vllm-openai:v0.24.0"
DEFAULT_MODEL = "RedHatAI/Llama-3.1-8B-Instruct"
SERVER_SERVICES = ("vllm", "vllm-cpu")
NOCHUNK_FLAG = "--no-enable-chunked-prefill"

# vLLM V1 metric names as exposed on /metrics (from the project's vLLM reference notes).
GAUGES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
}
COUNTERS = {
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:iteration_tokens_total",
    "vllm:request_num_preemptions",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

REQUIRED_PANEL_EXPRS = [
    "sum(vllm:num_requests_running)",
    "sum(vllm:num_requests_waiting)",
    "sum(vllm:kv_cache_usage_perc)",
    "sum(increase(vllm:num_preemptions_total[1m]))",
    "sum(rate(vllm:prompt_tokens_total[30s]))",
    "sum(rate(vllm:generation_tokens_total[30s]))",
    "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[30s])))",
    "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[30s])))",
]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_METRIC = re.compile(r"vllm:[A-Za-z_][A-Za-z0-9_]*")


def _load_yaml(path):
    with path.open() as f:
        return yaml.safe_load(f)


def _interpolate(value, env=None):
    """Resolve ${VAR}, ${VAR:-default} and ${VAR-default} the way compose does (no nesting)."""
    env = env or {}

    def sub(m):
        name, default = m.group(1), m.group(2)
        got = env.get(name)
        if got:
            return got
        return default if default is not None else ""

    return _VAR.sub(sub, value) if isinstance(value, str) else value


# Keys whose sequences an override file replaces instead of merging (compose merge rules).
_REPLACED_SEQUENCES = {"command", "entrypoint", "test"}


def _merge(base, override, key=None):
    """Merge an override compose document into a base one, as `docker compose -f a -f b` does."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = _merge(base[k], v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(override, list) and key not in _REPLACED_SEQUENCES:
        return base + [item for item in override if item not in base]
    return override


def _as_list(value):
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _command(service):
    return [str(_interpolate(arg)) for arg in _as_list(service.get("command"))]


def _flag_value(args, flag):
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def _host_ip(port):
    """Host IP of one `ports` entry, short ("IP:HOST:CONTAINER") or long syntax."""
    if isinstance(port, dict):
        return port.get("host_ip")
    parts = _interpolate(str(port)).split(":")
    return parts[0] if len(parts) == 3 else None


def _bind_mounts(service):
    """(source, target, mode) for each short-syntax volume entry, sources interpolated with defaults."""
    mounts = []
    for vol in service.get("volumes", []):
        assert isinstance(vol, str), f"unexpected long-syntax volume {vol!r}"
        parts = _interpolate(vol).split(":")
        mounts.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"))
    return mounts


@pytest.fixture(scope="module")
def compose():
    return _load_yaml(COMPOSE)


@pytest.fixture(scope="module")
def nochunk_doc():
    return _load_yaml(NOCHUNK)


@pytest.fixture(scope="module")
def services(compose):
    return compose["services"]


@pytest.fixture(scope="module")
def merged_nochunk(compose, nochunk_doc):
    return _merge(compose, nochunk_doc)["services"]


@pytest.fixture(scope="module")
def dashboard():
    with DASHBOARD.open() as f:
        return json.load(f)


def _panel_exprs(dashboard):
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs.append((panel["title"], target["expr"]))
    return exprs


# ---------------------------------------------------------------- compose: services and images


def test_services_and_profiles(services):
    assert {"vllm", "prometheus", "grafana", "vllm-cpu"} <= set(services)
    assert "profiles" not in services["vllm"], "the GPU server (chunked arm) must start by default"
    assert "profiles" not in services["prometheus"]
    assert services["grafana"]["profiles"] == ["grafana"]
    assert services["vllm-cpu"]["profiles"] == ["cpu"]


@pytest.mark.parametrize("path", [COMPOSE, NOCHUNK], ids=lambda p: p.name)
def test_every_image_pinned(path):
    doc = _load_yaml(path)
    for name, svc in doc["services"].items():
        image = svc.get("image")
        if image is None:
            continue
        repo, sep, tag = image.rpartition(":")
        assert sep and repo and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag not in ("", "latest"), f"{name}: image {image!r} is not pinned"
        assert "$" not in image, f"{name}: image {image!r} must not be interpolated"


def test_vllm_image_exact(services, merged_nochunk):
    assert services["vllm"]["image"] == VLLM_IMAGE
    assert merged_nochunk["vllm"]["image"] == VLLM_IMAGE
    assert services["vllm-cpu"]["image"] == "vllm/vllm-openai-cpu:v0.24.0"


def test_digest_recording_is_documented():
    text = COMPOSE.read_text()
    assert f"docker image inspect --format '{{{{index .RepoDigests 0}}}}' {VLLM_IMAGE}" in text


# ---------------------------------------------------------------- compose: GPU server


def test_gpu_reservation(services):
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", []) for d in devices
    ), devices


def test_cpu_server_reserves_no_gpu(services):
    assert "deploy" not in services["vllm-cpu"]


def test_ipc_host(services):
    assert services["vllm"]["ipc"] == "host"


def test_hf_cache_volume(services):
    mounts = _bind_mounts(services["vllm"])
    assert ("~/.cache/huggingface", "/root/.cache/huggingface", "rw") in mounts
    raw = services["vllm"]["volumes"]
    assert "${HF_CACHE:-~/.cache/huggingface}:/root/.cache/huggingface" in raw
    assert _interpolate(raw[0], {"HF_CACHE": "/data/hf"}).startswith("/data/hf:")


def test_hf_token_from_environment(services):
    env = services["vllm"]["environment"]
    assert env["HF_TOKEN"] == "${HF_TOKEN:-}"
    assert env["HUGGING_FACE_HUB_TOKEN"] == "${HF_TOKEN:-}"
    env_files = _as_list(services["vllm"]["env_file"])
    assert {"path": ".env", "required": False} in env_files


def test_model_default_and_override(services):
    args = _command(services["vllm"])
    assert _flag_value(args, "--model") == DEFAULT_MODEL
    raw = services["vllm"]["command"]
    model_arg = raw[raw.index("--model") + 1]
    assert _interpolate(model_arg, {"MODEL": "org/other"}) == "org/other"


@pytest.mark.parametrize("name", SERVER_SERVICES)
def test_prefix_caching_off(services, name):
    assert "--no-enable-prefix-caching" in _command(services[name])


def test_prefix_caching_off_in_nochunk_arm(merged_nochunk):
    assert "--no-enable-prefix-caching" in _command(merged_nochunk["vllm"])


@pytest.mark.parametrize("path", [COMPOSE, NOCHUNK], ids=lambda p: p.name)
def test_log_stats_never_disabled(path):
    doc = _load_yaml(path)
    for name, svc in doc["services"].items():
        assert "--disable-log-stats" not in _command(svc), name
        assert "--disable-log-stats" not in json.dumps(svc.get("environment", {})), name


@pytest.mark.parametrize("name", SERVER_SERVICES)
def test_server_listens_on_8000(services, name):
    assert _flag_value(_command(services[name]), "--port") == "8000"


# ---------------------------------------------------------------- compose: chunked-prefill arms


def test_chunked_arm_relies_on_default(services):
    args = _command(services["vllm"])
    assert not any("chunked-prefill" in a for a in args), args


def test_nochunk_arm_adds_only_the_flag(services, merged_nochunk):
    chunked = _command(services["vllm"])
    nochunk = _command(merged_nochunk["vllm"])
    assert nochunk.count(NOCHUNK_FLAG) == 1
    assert [a for a in nochunk if a != NOCHUNK_FLAG] == chunked


def test_nochunk_override_changes_nothing_else(nochunk_doc, services, merged_nochunk):
    assert set(nochunk_doc) == {"services"}
    assert set(nochunk_doc["services"]) == {"vllm"}
    assert set(nochunk_doc["services"]["vllm"]) == {"command"}
    for name, svc in services.items():
        for key, value in svc.items():
            if (name, key) != ("vllm", "command"):
                assert merged_nochunk[name][key] == value, (name, key)


def test_switch_command_documented():
    text = COMPOSE.read_text()
    assert "docker compose -f docker-compose.yml -f docker-compose.nochunk.yml up -d vllm" in text
    assert "docker compose -f docker-compose.yml -f docker-compose.nochunk.yml up -d vllm" in NOCHUNK.read_text()


# ---------------------------------------------------------------- compose: CPU server


def test_cpu_server(services):
    cpu = services["vllm-cpu"]
    args = _command(cpu)
    assert _flag_value(args, "--model") == "/model"
    assert _flag_value(args, "--load-format") == "dummy"
    assert _flag_value(args, "--dtype") == "bfloat16"
    assert _flag_value(args, "--max-model-len") == "8192"
    assert ("./.cache/tiny-model", "/model", "ro") in _bind_mounts(cpu)
    assert str(cpu["environment"]["VLLM_CPU_KVCACHE_SPACE"]) == "1"


def test_tiny_model_build_command_documented():
    assert "tailgate make-model .cache/tiny-model" in COMPOSE.read_text()


# ---------------------------------------------------------------- compose: network, ports, health


def test_every_port_binds_loopback(compose, merged_nochunk):
    checked = 0
    for svcs in (compose["services"], merged_nochunk):
        for name, svc in svcs.items():
            for port in svc.get("ports", []):
                assert _host_ip(port) == "127.0.0.1", f"{name}: {port!r} is not bound to 127.0.0.1"
                checked += 1
    assert checked >= 4


def test_vllm_port_default_and_override(services):
    for name in SERVER_SERVICES:
        (port,) = services[name]["ports"]
        assert _interpolate(port) == "127.0.0.1:8000:8000"
        assert _interpolate(port, {"VLLM_PORT": "8123"}) == "127.0.0.1:8123:8000"


@pytest.mark.parametrize("name", SERVER_SERVICES)
def test_server_alias_is_scrape_target(services, name):
    aliases = services[name]["networks"]["default"]["aliases"]
    assert "vllm" in aliases


@pytest.mark.parametrize("name", SERVER_SERVICES)
def test_healthcheck_hits_health(services, name):
    hc = services[name]["healthcheck"]
    test = hc["test"]
    assert test[0] in ("CMD", "CMD-SHELL")
    assert re.search(r"http://localhost:8000/health(?![\w/])", " ".join(test[1:])), test
    assert hc["interval"] == "10s"
    assert hc["start_period"] == "600s"


# ---------------------------------------------------------------- compose: Prometheus and Grafana


def test_prometheus_service(services):
    prom = services["prometheus"]
    args = _command(prom)
    assert "--config.file=/etc/prometheus/prometheus.yml" in args
    assert "--storage.tsdb.path=/prometheus" in args
    assert "--web.enable-lifecycle" in args
    mounts = _bind_mounts(prom)
    assert ("./deploy/prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml", "ro") in mounts
    assert prom["ports"] == ["127.0.0.1:9090:9090"]
    dep = prom["depends_on"]["vllm"]
    assert dep["required"] is False
    assert dep["condition"] == "service_started"


def test_compose_mount_sources_exist(services):
    for name in ("prometheus", "grafana"):
        for source, _, _ in _bind_mounts(services[name]):
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} missing"


def test_grafana_service(services):
    graf = services["grafana"]
    env = graf["environment"]
    assert str(env["GF_AUTH_ANONYMOUS_ENABLED"]).lower() == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = _bind_mounts(graf)
    assert ("./deploy/grafana/provisioning", "/etc/grafana/provisioning", "ro") in mounts
    assert ("./deploy/grafana/dashboards", "/var/lib/grafana/dashboards", "ro") in mounts
    assert graf["ports"] == ["127.0.0.1:3000:3000"]


# ---------------------------------------------------------------- Prometheus config


def _seconds(duration):
    m = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert m, duration
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def test_prometheus_scrapes_every_second():
    glob = _load_yaml(PROM_CONFIG)["global"]
    assert _seconds(glob["scrape_interval"]) == 1
    assert _seconds(glob["evaluation_interval"]) == 1
    assert _seconds(glob.get("scrape_timeout", "10s")) <= _seconds(glob["scrape_interval"])


def test_prometheus_job_targets_vllm(services):
    jobs = {job["job_name"]: job for job in _load_yaml(PROM_CONFIG)["scrape_configs"]}
    job = jobs["vllm"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["vllm:8000"]
    for job in jobs.values():
        assert _seconds(job.get("scrape_interval", "1s")) == 1, job["job_name"]
    host, port = targets[0].split(":")
    for name in SERVER_SERVICES:
        assert host in services[name]["networks"]["default"]["aliases"]
        assert _flag_value(_command(services[name]), "--port") == port


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_config():
    res = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(PROM_CONFIG)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- Grafana provisioning and dashboard


def test_grafana_datasource():
    (ds,) = _load_yaml(DATASOURCE)["datasources"]
    assert ds["name"] == "Prometheus"
    assert ds["type"] == "prometheus"
    assert ds["uid"] == "tailgate-prom"
    assert ds["url"] == "http://prometheus:9090"
    assert ds["isDefault"] is True


def test_grafana_dashboard_provider_points_at_mount(services):
    (provider,) = _load_yaml(DASH_PROVIDER)["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert path == "/var/lib/grafana/dashboards"
    targets = {target for _, target, _ in _bind_mounts(services["grafana"])}
    assert path in targets


def test_dashboard_shape(dashboard):
    assert dashboard["title"] == "tailgate / batching and tail latency"
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["type"] == "timeseries", panel["title"]
        assert panel["datasource"]["uid"] == "tailgate-prom", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "tailgate-prom", panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]


def test_dashboard_has_required_panels(dashboard):
    exprs = {" ".join(e.split()) for _, e in _panel_exprs(dashboard)}
    missing = [e for e in REQUIRED_PANEL_EXPRS if e not in exprs]
    assert not missing, missing


def _metric_known(name):
    if name in GAUGES or name in COUNTERS or name in HISTOGRAMS:
        return True
    return any(name.endswith(s) and name[: -len(s)] in HISTOGRAMS for s in HISTOGRAM_SUFFIXES)


def test_dashboard_queries_use_known_metrics(dashboard):
    for title, expr in _panel_exprs(dashboard):
        metrics = _METRIC.findall(expr)
        assert metrics, f"{title}: no vllm: metric in {expr!r}"
        for name in metrics:
            assert _metric_known(name), f"{title}: unknown metric {name}"
            assert not name.endswith("_created"), f"{title}: {name} is a creation timestamp"
            assert name not in HISTOGRAMS, f"{title}: histogram {name} used without a suffix"


def test_dashboard_counters_are_rated(dashboard):
    counters = set(COUNTERS) | {h + s for h in HISTOGRAMS for s in HISTOGRAM_SUFFIXES}
    for title, expr in _panel_exprs(dashboard):
        for name in _METRIC.findall(expr):
            if name in counters:
                assert re.search(r"(rate|increase)\(\s*" + re.escape(name) + r"(\{[^}]*\})?\[", expr), (
                    f"{title}: counter {name} must be wrapped in rate() or increase()"
                )


def test_dashboard_quantiles_use_buckets(dashboard):
    for title, expr in _panel_exprs(dashboard):
        if "histogram_quantile" in expr:
            assert re.search(r"by \(le\)", expr), title
            assert all(m.endswith("_bucket") for m in _METRIC.findall(expr)), title


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_dashboard_queries_parse(dashboard, tmp_path):
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"tailgate:panel_{i}", "expr": expr}
                    for i, (_, expr) in enumerate(_panel_exprs(dashboard))
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_known_metrics_match_reference():
    lines = VLLM_METRICS.read_text().splitlines()
    listed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    expected = GAUGES | COUNTERS | HISTOGRAMS
    assert expected <= listed, sorted(expected - listed)


# ---------------------------------------------------------------- environment


def _env_example_vars():
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"malformed line {line!r}"
            out[key.strip()] = value.strip()
    return out


def test_env_file_is_git_ignored():
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", ".env"], capture_output=True)
    assert res.returncode == 0, ".env is not ignored by git"
    res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", ".env.example"], capture_output=True)
    assert res.returncode == 1, ".env.example must be tracked"


def test_env_example_documents_variables():
    assert ENV_EXAMPLE.is_file()
    env = _env_example_vars()
    for key in ("HF_TOKEN", "MODEL", "VLLM_PORT", "HF_CACHE", "TAILGATE_API_KEY"):
        assert key in env, key
    assert env["HF_TOKEN"] == "", "no secret in the template"
    assert env["TAILGATE_API_KEY"] == "", "no secret in the template"
    assert env["MODEL"] == DEFAULT_MODEL
    assert ".env" in ENV_EXAMPLE.read_text() and "git-ignored" in ENV_EXAMPLE.read_text()


def test_every_compose_variable_documented():
    documented = set(_env_example_vars())
    used = set()
    for path in (COMPOSE, NOCHUNK):
        used |= {m.group(1) for m in _VAR.finditer(path.read_text())}
    assert used, "no variables found"
    assert used <= documented, sorted(used - documented)


def test_api_key_reaches_servers(services):
    for name in SERVER_SERVICES:
        assert services[name]["environment"]["VLLM_API_KEY"] == "${TAILGATE_API_KEY:-}", name


def test_preempt_override_adds_only_the_pool_flags() -> None:
    root = Path(__file__).resolve().parent.parent
    base = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["vllm"]["command"]
    doc = yaml.safe_load((root / "docker-compose.preempt.yml").read_text())
    assert set(doc["services"]) == {"vllm"} and set(doc["services"]["vllm"]) == {"command"}
    command = [str(a) for a in doc["services"]["vllm"]["command"]]
    assert command[: len(base)] == [str(a) for a in base]
    assert command[len(base) :] == ["--max-model-len", "8192", "--num-gpu-blocks-override", "4000"]


# ------------------------------------------------------------------------------------------- CPU stack

CPU_COMPOSE = ROOT / "docker-compose.cpu.yml"
CPU_OVERRIDES = {"nochunk": ROOT / "deploy" / "cpu" / "compose.nochunk.yml",
                 "preempt": ROOT / "deploy" / "cpu" / "compose.preempt.yml"}  # fmt: skip
CPU_ADDED = {"nochunk": ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"],
             "preempt": ["--num-gpu-blocks-override", "58"]}  # fmt: skip


@pytest.fixture(scope="module")
def cpu_services():
    return _load_yaml(CPU_COMPOSE)["services"]


def test_cpu_stack_is_loopback_only(cpu_services):
    """Host networking, nothing published, every listener on 127.0.0.1: no traffic leaves loopback."""
    assert set(cpu_services) == {"vllm", "prometheus"}
    for name, service in cpu_services.items():
        assert service["network_mode"] == "host", name
        assert "ports" not in service and "networks" not in service, name
        assert service["profiles"] == ["cpu"], name
        assert service["pull_policy"] == "never", name  # built here from BASE_IMAGE, never pulled
        assert service["build"]["network"] == "host", name
        assert "BASE_IMAGE" in service["build"]["args"], name
    command = _command(cpu_services["vllm"])
    assert _flag_value(command, "--host") == "127.0.0.1"
    env = cpu_services["prometheus"]["environment"]
    assert _interpolate(env["SCRAPE_TARGET"]) == "127.0.0.1:8000"
    assert _interpolate(env["LISTEN_ADDRESS"]) == "127.0.0.1:9090"
    assert _interpolate(env["SCRAPE_TARGET"], {"VLLM_PORT": "18000"}) == "127.0.0.1:18000"


@pytest.mark.parametrize("config", sorted(CPU_OVERRIDES))
def test_cpu_overrides_only_add_their_flags(cpu_services, config):
    base = _command(cpu_services["vllm"])
    override = _command(_load_yaml(CPU_OVERRIDES[config])["services"]["vllm"])
    added = CPU_ADDED[config]
    assert override[len(override) - len(added) :] == added
    rest = override[: len(override) - len(added)]
    if config == "preempt":  # the small pool needs a context that fits it; nothing else differs
        assert _flag_value(rest, "--max-model-len") == "7200"
        rest[rest.index("--max-model-len") + 1] = _flag_value(base, "--max-model-len")
    assert rest == base


def test_cpu_stack_matches_the_embedded_flags(cpu_services):
    """The compose CPU server and the embedded one are the same server, another wiring."""
    from tailgate.serverconfigs import EMBEDDED_BASE_FLAGS, EMBEDDED_NOCHUNK_FLAGS, EMBEDDED_PREEMPT_FLAGS

    command = _command(cpu_services["vllm"])
    assert all(flag in command for flag in EMBEDDED_BASE_FLAGS)
    assert CPU_ADDED["nochunk"] == EMBEDDED_NOCHUNK_FLAGS
    assert ["--max-model-len", "7200", *CPU_ADDED["preempt"]] == EMBEDDED_PREEMPT_FLAGS
    for flag in ("--load-format", "--dtype", "--max-model-len", "--served-model-name"):
        assert flag in command


def _compose_cli():
    """`docker compose` when it runs here (config needs no engine); CI as root must have it."""
    import os

    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if os.environ.get("CI") and os.geteuid() == 0:
        pytest.fail("docker compose is not installed (scripts/setup.sh installs it)")
    pytest.skip("docker compose is not installed (scripts/setup.sh installs it)")


@pytest.mark.parametrize(
    "files",
    [["docker-compose.yml"], ["docker-compose.yml", "docker-compose.nochunk.yml"],
     ["docker-compose.yml", "docker-compose.preempt.yml"], ["docker-compose.cpu.yml"],
     ["docker-compose.cpu.yml", "deploy/cpu/compose.nochunk.yml"],
     ["docker-compose.cpu.yml", "deploy/cpu/compose.preempt.yml"]],
    ids=lambda f: "+".join(Path(x).name for x in f),
)  # fmt: skip
def test_docker_compose_config_accepts(files):
    """Compose itself resolves every arm of both stacks, profiles included."""
    argv = [*_compose_cli(), "--project-directory", str(ROOT)]
    for f in files:
        argv += ["-f", str(ROOT / f)]
    done = subprocess.run([*argv, "--profile", "cpu", "--profile", "grafana", "config", "--format", "json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert "vllm" in services and "prometheus" in services
    nochunk = any("nochunk" in f for f in files)
    assert ("--no-enable-chunked-prefill" in services["vllm"]["command"]) == nochunk
