"""tailgate: what does your batching policy do to tail latency?

The core here is shared by the load path (Locust, gevent) and the analysis path (pandas):
it imports neither, so both sides agree on one trace, one record schema and one set of
percentile rules.
"""

__version__ = "0.1.0"
