"""The slicer's pure placement core: cluster model, fragmentation metric, policies, scheduler.

No NATS, no wall clock, no I/O: typed inputs to typed decisions.
"""
