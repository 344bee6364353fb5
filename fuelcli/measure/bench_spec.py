"""`fuel bench`'s tests: what to run (-p, -n, -d, --parallel), llama-bench's order, and the
context and sequences they need."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class TestSpec:
    __test__ = False  # not a pytest class
    kind: str  # "pp" | "tg"
    n_tokens: int
    depth: int = 0
    seqs: int = 1  # sequences decoding side by side (tg)

    @property
    def name(self) -> str:
        return (f"{self.kind}{self.n_tokens}" + (f" x{self.seqs}" if self.seqs > 1 else "")
                + (f" @ d{self.depth}" if self.depth else ""))

    @property
    def tokens(self) -> int:
        """Tokens one run processes (over all its sequences)."""
        return self.n_tokens * self.seqs


def parse_int_list(text: str, option: str) -> list[int]:
    """'64,512' -> [64, 512]; every value >= 0; duplicates dropped, order kept."""
    out = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise InputError(f"{option} takes comma-separated integers, got {text!r}") from None
        if v < 0:
            raise InputError(f"{option} values must be >= 0, got {v}")
        if v not in out:
            out.append(v)
    if not out:
        raise InputError(f"{option} needs at least one value, got {text!r}")
    return out


def make_tests(pp: list[int], tg: list[int], depths: list[int], seqs: list[int] = (1,)) -> list[TestSpec]:
    """llama-bench order: for each depth, every pp test then every tg test (at each width of seqs);
    0 means skip."""
    if any(b < 1 for b in seqs):
        raise InputError(f"--parallel values must be at least 1, got {min(seqs)}")
    tests = [t for d in depths for t in [TestSpec("pp", n, d) for n in pp if n > 0]
             + [TestSpec("tg", n, d, b) for n in tg if n > 0 for b in seqs]]
    if not tests:
        raise InputError("nothing to run: every -p and -n value is 0")
    return tests


def context_needed(tests: list[TestSpec]) -> int:
    """KV cache positions a sequence needs: depth + the test's tokens, + 1 spare (the largest over tests)."""
    return max(t.depth + t.n_tokens for t in tests) + 1


def seqs_needed(tests: list[TestSpec]) -> int:
    """Sequences the engine holds at once (its slots)."""
    return max(t.seqs for t in tests)
