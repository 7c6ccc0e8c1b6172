from __future__ import annotations

import sys
from pathlib import Path

# The hand-made recordings live beside the tests as a plain module.
sys.path.insert(0, str(Path(__file__).parent))
