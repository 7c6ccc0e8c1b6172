"""Generate proto/schemas/<tag>.json (JSON Schema of every event) and check them for drift.

    python tools/gen/gen_schemas.py          # rewrite the schemas
    python tools/gen/gen_schemas.py --check  # exit 1 if any schema differs from the code

What the files hold is ``seedance.events.schemas``; this script only reads and writes them.
Golden messages (proto/golden/<tag>.json) are written by hand, once per event version, and never
regenerated: tests decode them with the current types, which is what holds the evolution rule.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seedance.events import schemas

OUT = Path(__file__).resolve().parents[2] / "proto" / "schemas"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on drift instead of writing")
    args = parser.parse_args()
    files = schemas.render()
    existing = {p.name: p.read_text() for p in OUT.glob("*.json")}
    if args.check:
        drift = schemas.drift(existing)
        if drift:
            print("schemas out of date (run `make schemas`): " + ", ".join(drift), file=sys.stderr)
            return 1
        print(f"{len(files)} event schemas match the code")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in set(existing) - set(files):
        (OUT / stale).unlink()
    for name, text in files.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(files)} schemas to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
