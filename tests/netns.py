"""Separate hosts on one machine for tests: the product's network namespaces (:mod:`tailgate.verify.netns`)."""

from tailgate.verify.netns import Hosts, NetnsUnavailable

__all__ = ["Hosts", "NetnsUnavailable"]
