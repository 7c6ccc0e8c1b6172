"""Generate proto/schemas/<tag>.json (JSON Schema of every event) and check them for drift.

    python tools/gen/gen_schemas.py          # rewrite the schemas
    python tools/gen/gen_schemas.py --check  # exit 1 if any schema differs from the code

Golden messages (proto/golden/<tag>.json) are written by hand, once per event version, and never
regenerated: tests decode them with the current types, which is what holds the evolution rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

from seedance.events import event_types

OUT = Path(__file__).resolve().parents[2] / "proto" / "schemas"


def render() -> dict[str, str]:
    files: dict[str, str] = {}
    for t in event_types():
        tag = t.__struct_config__.tag
        schema = msgspec.json.schema(t)
        files[f"{tag}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on drift instead of writing")
    args = parser.parse_args()
    files = render()
    existing = {p.name for p in OUT.glob("*.json")}
    if args.check:
        drift = sorted(
            name
            for name, text in files.items()
            if not (OUT / name).exists() or (OUT / name).read_text() != text
        )
        drift += sorted(existing - set(files))
        if drift:
            print("schemas out of date (run `make schemas`): " + ", ".join(drift), file=sys.stderr)
            return 1
        print(f"{len(files)} event schemas match the code")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in existing - set(files):
        (OUT / stale).unlink()
    for name, text in files.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(files)} schemas to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
