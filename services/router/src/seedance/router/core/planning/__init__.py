"""Replica planning: how many replicas a model needs (`planner`), the load forecast the planner
sizes for (`load`) and the replica set that follows the plan (`replica_set`).

Pure code, like the rest of `seedance.router.core`: the service and the replay simulator feed it
observations and times and act on what it returns.
"""
