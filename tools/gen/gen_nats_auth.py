"""Render nats-server's ``authorization`` block: a thin entry point over the catalogue.

Who may do what is declared in ``seedance.events.permissions`` (services, the replayer, the
auth-callout service, tenants); what a deployment chooses (``deploy/auth/users.yaml``: its static
tenants, its operators, whether auth callout authorises everyone else) is read, rendered and
checked by ``seedance.events.nats_config.AuthChoices``. This script only reads that file and
writes the rendered copies (``nats_config.RENDERED_FILES``); ``--check`` fails when either
differs from a fresh render.

    python tools/gen/gen_nats_auth.py                 # write both files
    python tools/gen/gen_nats_auth.py --check         # exit 1 on drift
    python tools/gen/gen_nats_auth.py --check-env F   # every NATS_PASSWORD_* in env file F (or the
                                                  # environment, with '-') follows the rule and,
                                                  # where NATS_PUBLISH_IP opens NATS beyond the
                                                  # loopback, is no public dev-<user> default,
                                                  # nor is any auth callout key the public
                                                  # development pair's (on the loopback: a
                                                  # warning). F is read by compose's .env
                                                  # rules, but a '$' it would interpolate is
                                                  # not: such a checked value is refused
                                                  # beyond the loopback (warned on it);
                                                  # as compose, a NATS_PUBLISH_IP,
                                                  # NATS_PASSWORD_* or callout key set in the
                                                  # shell wins over F's (each one named)
    python tools/gen/gen_nats_auth.py --check-env F --cluster   # also the NATS cluster's route
                                                  # password (Kubernetes base: NATS_ROUTE_PASSWORD,
                                                  # seedance.events.nats_routes)
    python tools/gen/gen_nats_auth.py --new-password  # print a password that follows the rule
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from seedance.events import nats_config, nats_routes
from seedance.events.permissions import PermissionsError

REPO = Path(__file__).resolve().parents[2]


def _choices() -> nats_config.AuthChoices:
    doc = yaml.safe_load((REPO / nats_config.USERS_FILE).read_text())
    try:
        return nats_config.AuthChoices.from_document(doc)
    except PermissionsError as exc:
        raise SystemExit(str(exc)) from exc


def _env(path: str) -> tuple[dict[str, str], frozenset[str]]:
    """The values compose would substitute: env file ``path`` under the shell's (or the
    shell's alone, ``-``), and the file's variables compose interpolates (`EnvFile`) that the
    shell does not override; each variable the shell overrides is named on stderr. The file's
    bytes are read as they are (no newline translation: a lone CR ends no line for compose)."""
    if path == "-":
        return dict(os.environ), frozenset()
    try:
        env_file = nats_config.read_env_file(Path(path).read_bytes())
    except nats_config.EnvFileError as exc:
        raise SystemExit(f"{path}: {exc} (compose refuses this file)") from exc
    values, from_shell = nats_config.compose_values(env_file.values, os.environ)
    for var in from_shell:
        print(f"note: {var} from the environment, not {path} (compose prefers it)", file=sys.stderr)
    return values, env_file.interpolated - set(from_shell)


def _write_or_check(text: str, *, check: bool) -> int:
    drifted = []
    for rel in nats_config.RENDERED_FILES:
        out = REPO / rel
        if check:
            if not out.exists() or out.read_text() != text:
                drifted.append(rel)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"wrote {rel}", file=sys.stderr)
    if drifted:
        print(f"out of date (run `make nats-auth`): {', '.join(drifted)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the rendered files drifted")
    ap.add_argument(
        "--check-env",
        metavar="FILE",
        help="check the passwords and callout keys in FILE ('-': env); the shell's own "
        "NATS_PUBLISH_IP, NATS_PASSWORD_* and callout keys win over FILE's, as in compose",
    )
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="with --check-env: FILE is a clustered NATS's (the Kubernetes base's Secret), so it "
        f"also needs the routes' password, {nats_routes.ROUTE_PASSWORD_VAR}",
    )
    ap.add_argument("--new-password", action="store_true", help="print a valid password")
    args = ap.parse_args()
    if args.cluster and not args.check_env:
        ap.error("--cluster goes with --check-env FILE")
    if args.new_password:
        print(nats_config.new_password())
        return 0
    if args.check_env:
        env, interpolated = _env(args.check_env)
        for w in _choices().password_warnings(env, interpolated=interpolated):
            print(f"warning: {w}", file=sys.stderr)
        problems = _choices().password_problems(env, interpolated=interpolated)
        if args.cluster:
            problems += nats_routes.route_password_problems(env, interpolated=interpolated)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    return _write_or_check(_choices().render(), check=args.check)


if __name__ == "__main__":
    raise SystemExit(main())
