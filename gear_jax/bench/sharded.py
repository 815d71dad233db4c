"""The `sharded` suite: multi-device selection modes. gear_jax has no sharded tables yet, so this
suite only says so, and its report holds that note and no measurements."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

DEFAULTS = {"table_rows": "100000", "item_bytes": "1024", "batch_size": "1024"}
PLOT = None
AVAILABLE = False
NOTE = ("sharded selection (global weighted/uniform, decentralized top-k/FIFO/LIFO, local stratified) "
        "is not available in this build of gear_jax: there is no ShardedTable yet, so nothing was measured")


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """No records; notes that the feature is missing."""
    note(NOTE)
    return []
