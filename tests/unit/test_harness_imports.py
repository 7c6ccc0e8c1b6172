"""Tests import packages (``seedance.testing``, ``seedance.bench``), never the ``tools/`` scripts.

``tools/`` holds thin entry points; a test that imports one ties itself to a script's layout.
An AST scan of every test module: no ``import tools...`` / ``from tools... import``, no
``importlib.import_module("tools...")``. What still reaches into ``tools/`` by path (generators
run or loaded by path, the pinned nats-server digest, one soak run with ``-m``) is pinned below,
so a new link fails here until it is either a package import or added with a reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# Test module -> why it still reaches tools/ by path. Running an entry point as a process (its
# last line is what a user sees) may stay; loading a script as a module should not (what the
# generators render is seedance.events.nats_config / seedance.events.schemas, which the deploy
# and golden tests import).
PATH_LINKS = {
    "e2e/test_bench_k8s.py": "runs the bench's CI form through its entry point, as make does",
    "e2e/test_bench_scale.py": "runs the bench's CI form through its entry point, as make does",
    "e2e/test_chaos_tenants.py": "runs the soak's entry point (`-m tools.bench...`) as a process",
    "e2e/test_demo_exports.py": "runs `make demo`'s entry point (`-m tools.demo`), short",
    "e2e/test_demo_on_a_users_server.py": "runs `make demo`'s entry point on its own server",
    "e2e/test_demo_readme.py": "runs `make demo`'s entry point (`-m tools.demo`), short",
    "e2e/test_readme_local.py": "runs the README walkthrough (`-m tools.local_stack`)",
    "unit/deploy/test_dev_passwords.py": "runs `--check-env` (`-m tools.gen.gen_nats_auth`)",
    "unit/deploy/test_env_file.py": "runs `--check-env` (`-m tools.gen.gen_nats_auth`)",
    "unit/deploy/test_k8s_nats_routes.py": "runs `--check-env --cluster` (`-m tools.gen...`)",
    "unit/ledger/test_focus_conformance.py": "runs tools/bench/ledger_sample_report.py",
    "unit/router/test_bench_autoscale.py": "runs two benches' entry points (`-m tools.bench.*`)",
    "unit/router/test_bench_kv_forecast_splits.py": "runs the KV bench's entry point with --splits",
    "unit/router/test_bench_kv_scores.py": "runs the KV bench's entry point with --span-s",
    "unit/test_data.py": "scans tools/ (as mk/, tests/, harness/) for the trace files read",
}


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def _is_tools(module: str | None) -> bool:
    return module is not None and (module == "tools" or module.startswith("tools."))


def tools_imports(source: str) -> list[str]:
    """Each import of the ``tools`` package in ``source``, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_tools(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_tools(node.module):
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _is_tools(node.args[0].value)
        ):
            found.append(f"{node.lineno}: import_module({node.args[0].value!r})")
    return found


def _mentions_tools_path(source: str) -> bool:
    return any(
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "tools" or node.value.startswith(("tools/", "tools.")))
        for node in ast.walk(ast.parse(source))
    )


def test_no_test_module_imports_tools() -> None:
    offenders = {
        str(p.relative_to(TESTS)): hits
        for p in _test_modules()
        if (hits := tools_imports(p.read_text()))
    }
    assert offenders == {}, f"import seedance.testing / seedance.bench instead: {offenders}"


def test_the_remaining_path_links_into_tools_are_the_listed_ones() -> None:
    linked = {
        str(p.relative_to(TESTS))
        for p in _test_modules()
        if p.name != Path(__file__).name and _mentions_tools_path(p.read_text())
    }
    assert linked == set(PATH_LINKS)


def test_the_scan_sees_each_form_of_import() -> None:
    source = (
        "import tools.stack\n"
        "from tools.gen import gen_nats_auth\n"
        "from tools import triton_process\n"
        "importlib.import_module('tools.chaos_tenants')\n"
        "import toolsmith\n"  # another package: not tools
        "from .tools import x\n"  # a relative import: not the top-level tools
        "from seedance.testing.servers import NatsServer\n"
    )
    assert tools_imports(source) == [
        "1: import tools.stack",
        "2: from tools.gen import ...",
        "3: from tools import ...",
        "4: import_module('tools.chaos_tenants')",
    ]
