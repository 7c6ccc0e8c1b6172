"""The graph compiler's pure core: passes, precision lowering, checks, and the compile API.

Deliberately imports nothing, so the measurement child (``measure.py``, run as a script) and
light importers do not pay for onnx/onnxscript.
"""
