"""The graph compiler's pure core: passes, precision lowering, checks, candidate selection and
the compile API. Nothing here reads the clock or spawns processes: timing comes in through the
``Measurer`` that ``compile_model`` is handed (``seedance.graph_compiler.measuring`` has the
ONNX Runtime one).

Deliberately imports nothing, so light importers do not pay for onnx/onnxscript.
"""
