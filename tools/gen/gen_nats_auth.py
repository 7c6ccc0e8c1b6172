"""Render nats-server's ``authorization`` block: a thin entry point over the catalogue.

Who may do what is declared in ``seedance.events.permissions`` (services, the replayer, the
auth-callout service, tenants) and rendered by ``seedance.events.nats_config``;
``deploy/auth/users.yaml`` lists only what a deployment chooses: its static tenants, its
operators, and whether auth callout authorises everyone else (tenants added at run time).

One source, two copies of the same output: ``deploy/auth/nats-auth.conf`` (compose mounts it) and
``deploy/k8s/base/nats/auth.conf`` (kustomize turns it into the ConfigMap; kustomize cannot read
files above its root, hence the copy). ``--check`` fails when either differs from a fresh render.

    python tools/gen/gen_nats_auth.py                 # write both files
    python tools/gen/gen_nats_auth.py --check         # exit 1 on drift
    python tools/gen/gen_nats_auth.py --check-env F   # every NATS_PASSWORD_* in env file F (or the
                                                  # environment, with '-') follows the rule
    python tools/gen/gen_nats_auth.py --new-password  # print a password that follows the rule
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from seedance.events import nats_config
from seedance.events.permissions import User

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "deploy" / "auth" / "users.yaml"
OUTPUTS = (
    REPO / "deploy" / "auth" / "nats-auth.conf",
    REPO / "deploy" / "k8s" / "base" / "nats" / "auth.conf",
)
password_var = nats_config.password_var


def load_source(path: Path = SOURCE) -> dict[str, object]:
    source = yaml.safe_load(path.read_text()) or {}
    unknown = set(source) - {"tenants", "operators", "auth_callout"}
    if unknown:
        raise SystemExit(
            f"{path.name}: unknown keys {sorted(unknown)} (services are declared in "
            "seedance.events.permissions, not here)"
        )
    return source


def users_from(source: dict[str, object]) -> list[User]:
    tenants = source.get("tenants") or []
    operators = source.get("operators") or []
    assert isinstance(tenants, list), "tenants: a list of tenant ids"
    assert isinstance(operators, list), "operators: a list of user names"
    return nats_config.users(tenants, operators, callout=bool(source.get("auth_callout")))


def render_source(path: Path = SOURCE) -> str:
    source = load_source(path)
    callout = nats_config.CALLOUT_ISSUER_VAR if source.get("auth_callout") else None
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return nats_config.render(users_from(source), source=str(rel), callout_issuer_var=callout)


def check_env(values: dict[str, str]) -> list[str]:
    """The problems of the passwords the rendered config needs, one line each."""
    problems = []
    for user in users_from(load_source()):
        var = password_var(user.name)
        if var not in values:
            problems.append(f"{var} is not set")
            continue
        try:
            nats_config.check_server_password(var, values[var])
        except nats_config.PasswordError as exc:
            problems.append(str(exc))
    return problems


def _env_file(path: str) -> dict[str, str]:
    if path == "-":
        return dict(os.environ)
    out = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the rendered files drifted")
    ap.add_argument("--check-env", metavar="FILE", help="check the passwords in FILE ('-': env)")
    ap.add_argument("--new-password", action="store_true", help="print a valid password")
    args = ap.parse_args()
    if args.new_password:
        print(nats_config.new_password())
        return 0
    if args.check_env:
        problems = check_env(_env_file(args.check_env))
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    text = render_source()
    drifted = []
    for out in OUTPUTS:
        if args.check:
            if not out.exists() or out.read_text() != text:
                drifted.append(out.relative_to(REPO))
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"wrote {out.relative_to(REPO)}", file=sys.stderr)
    if drifted:
        print(
            f"out of date (run `make nats-auth`): {', '.join(map(str, drifted))}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
