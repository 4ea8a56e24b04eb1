"""Which pass runs a test that never uses Django's test database (``--non-database-share``, tests/conftest.py).

Such a test module belongs to exactly one share of N: the modules listed in ``non_database_weights.toml`` are
dealt out greedily, the heaviest first (ties by path), each to the lightest share so far (ties to the lowest
number); a module not listed goes to share ``crc32(path) % N + 1``. The rule depends only on the module's path
and the weight file, never on what a pass collected, so passes that select other tests still agree on it.
"""

from __future__ import annotations

import tomllib
import zlib
from pathlib import Path

WEIGHTS_FILE = Path(__file__).with_name("non_database_weights.toml")


def parse_share(text: str) -> tuple[frozenset[int], int]:
    """``"K/N"`` or ``"K1,K2/N"``: the share numbers taken (1..N) and N."""
    try:
        taken, _, total = text.partition("/")
        count = int(total)
        numbers = frozenset(int(part) for part in taken.split(","))
    except ValueError:
        raise ValueError(f"--non-database-share={text!r}: expected K/N or K1,K2/N, e.g. 1/2 or 1,2,3/5") from None
    if count < 1 or not numbers or not all(1 <= number <= count for number in numbers):
        raise ValueError(f"--non-database-share={text!r}: each share number must be between 1 and {count}")
    return numbers, count


def load_weights(path: Path = WEIGHTS_FILE) -> dict[str, float]:
    with path.open("rb") as source:
        weights = tomllib.load(source)["weights"]
    return {str(module): float(weight) for module, weight in weights.items()}


def deal(weights: dict[str, float], count: int) -> dict[str, int]:
    """The listed modules' shares (1..count): greedy, heaviest first, each to the lightest share so far."""
    loads = [0.0] * count
    shares = {}
    for module, weight in sorted(weights.items(), key=lambda item: (-item[1], item[0])):
        lightest = min(range(count), key=lambda index: (loads[index], index))
        loads[lightest] += weight
        shares[module] = lightest + 1
    return shares


def share_of(module: str, count: int, dealt: dict[str, int]) -> int:
    """The share (1..count) of a test module given as a path relative to the repository (``tests/x.py``)."""
    if module in dealt:
        return dealt[module]
    return zlib.crc32(module.encode()) % count + 1
