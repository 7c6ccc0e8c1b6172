# Stand-in for `nvcr.io/nvidia/tritonserver` in `make compose-check` only (that registry cannot
# be reached here): the Triton 2.51 server that nvidia-pytriton bundles (the package the router's
# integration tests run, from the same hash-pinned requirements file) on the Seedance base image,
# on the CPU. `tritonserver` on PATH is a wrapper that gives the bundled server its backends
# directory, so compose's `command:` (`tritonserver --model-repository=/models ...`) runs
# unchanged; curl is there for compose's declared healthcheck.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends curl >/dev/null \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY triton-requirements.txt /tmp/triton-requirements.txt
RUN --mount=type=secret,id=ca-bundle \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \
    python3.11 -m venv /opt/triton \
    && /opt/triton/bin/pip install --no-cache-dir --disable-pip-version-check -q \
       --require-hashes -r /tmp/triton-requirements.txt
# What PyTriton does before it starts the server: the Python backend's stub for this
# interpreter's minor version, where the backend looks for it. The stub runs the base's python3
# with an environment of its own (PYTHONPATH does not reach it), so a .pth file in that
# interpreter's site directory lets the models import numpy and the backend's utilities.
RUN d=/opt/triton/lib/python3.11/site-packages/pytriton/tritonserver \
    && cp "$d/python_backend_stubs/3.11/triton_python_backend_stub" "$d/backends/python/" \
    && site=$(python3.11 -c 'import site; print(site.getsitepackages()[0])') \
    && mkdir -p "$site" && echo /opt/triton/lib/python3.11/site-packages > "$site/pytriton-venv.pth"
COPY tritonserver /usr/local/bin/tritonserver
