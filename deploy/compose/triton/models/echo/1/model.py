"""Triton Python-backend model `echo` for the compose stack: output `y` is input `x`.

Runs inside the Triton image (``triton_python_backend_utils`` is the backend's own module), not
in the workspace.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
