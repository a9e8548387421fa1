"""Start, stop and restart the vLLM server a benchmark runs against.

The suite compares batching policies (chunked prefill on and off) on one server, so it has to restart
that server with different flags between runs and record exactly how it was started. Three ways to own
a server share one small interface, :class:`ServerController`:

* :class:`LocalVllmServer` runs a CPU build of vLLM from a private virtual environment with a tiny model
  and random weights, so the whole suite can run end to end on a laptop or a CI runner.
* :class:`ComposeServer` drives a ``docker compose`` service (a GPU server in practice).
* :class:`ManualServer` asks a person to restart a server the suite cannot reach, then waits for it.

Only the standard library is used: this module runs before, and outside of, the load generator, and must
not pull in gevent's monkey-patching or pandas.
"""

from tailgate.serverconfigs import CHUNKED_OFF_FLAG

from .base import HOST, ServerController, ServerError
from .compose import ComposeByConfig, ComposeServer, ComposeSetupError
from .fixed import FixedServer
from .install import default_vllm_python, ensure_tiny_model, ensure_vllm_venv, tailgate_home
from .local import LocalVllmServer, group_members, vllm_server_argv
from .manual import ManualServer
from .net import free_port, http_json, http_status, is_healthy

__all__ = [
    "CHUNKED_OFF_FLAG",
    "HOST",
    "ComposeByConfig",
    "ComposeServer",
    "ComposeSetupError",
    "FixedServer",
    "LocalVllmServer",
    "ManualServer",
    "ServerController",
    "ServerError",
    "default_vllm_python",
    "ensure_tiny_model",
    "ensure_vllm_venv",
    "free_port",
    "group_members",
    "http_json",
    "http_status",
    "is_healthy",
    "tailgate_home",
    "vllm_server_argv",
]
