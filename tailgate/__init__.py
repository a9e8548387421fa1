"""tailgate: what does your batching policy do to tail latency?

The package is laid out by role (``ARCHITECTURE.md`` draws the data flow):

* ``records`` and ``stats``: the record schema and the summary rules, shared by the load path and the
  analysis; they import neither gevent nor pandas, so both sides agree on one schema and one set of
  percentile rules.
* ``load``: the trace, the schedules and the streaming client that run inside Locust.
* ``shapes`` and ``locustfiles``: the arms as Locust shapes and the thin locustfiles users point at.
* ``postprocess``: the analysis (pandas, matplotlib) from a results folder to the HTML report.
* ``servers``: starting, restarting and describing the vLLM server under test.
* ``verify``: the ground-truth server and the self-check that measure the suite's own timing error.
* ``suite`` and ``cli``: the ``tailgate`` command that runs all of it.
"""

__version__ = "0.1.0"
