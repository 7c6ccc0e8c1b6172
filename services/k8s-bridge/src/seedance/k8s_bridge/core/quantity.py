"""Kubernetes resource quantities: `seedance.events.quantity`, re-exported.

The grammar moved to the events library so that the node agent reads a pod's requests with the
same parser (and the same counting rule, `seedance.events.pod_requests`) as the bridge; the
bridge's modules keep importing it from here.
"""

from seedance.events.quantity import InvalidQuantity, parse_quantity, to_count, to_mib, to_milli

__all__ = ["InvalidQuantity", "parse_quantity", "to_count", "to_mib", "to_milli"]
