"""Replaying pair tests opened late (the neighbour ε-ranking, :mod:`.neighbour_ranking`): the scores of every look
kept — bit-packed when 0/1 — with each model's sums over the look, and one look fed into a batch of pair tests in
slices of pairs. A pair opened at look t is fed looks 0..t in turn, so its tests follow the path they would have had
from the first item of the order."""

from __future__ import annotations

from typing import Any

import numpy as np

from .look_tests import LookTests

_CELLS = 1 << 22  # pairs x items per vectorised step


class ScoreStore:
    """The scores of every look so far, to replay a pair opened late: per look the (M, b) block, bit-packed when
    every value is 0 or 1, and each model's sums over the look (Σx, Σx², Σ g x, Σ w x)."""

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []  # packed uint64 (M, words) or float64 (M, b)
        self.binary: list[bool] = []
        self.sizes: list[int] = []
        self.w: list[np.ndarray] = []
        self.g: list[np.ndarray] = []
        self.sums: list[np.ndarray] = []  # (M, 4): Σx, Σx², Σ g x, Σ w x

    def __len__(self) -> int:
        return len(self.blocks)

    def add(self, y: np.ndarray, w: np.ndarray, g: np.ndarray) -> None:
        binary = bool(np.all((y == 0.0) | (y == 1.0)))
        if binary:
            bits = np.packbits(y.astype(np.uint8), axis=1)
            pad = (-bits.shape[1]) % 8
            if pad:
                bits = np.concatenate([bits, np.zeros((bits.shape[0], pad), dtype=np.uint8)], axis=1)
            self.blocks.append(np.ascontiguousarray(bits).view(np.uint64))
        else:
            self.blocks.append(np.ascontiguousarray(y, dtype=float))
        self.binary.append(binary)
        self.sizes.append(int(y.shape[1]))
        self.w.append(np.asarray(w, dtype=float))
        self.g.append(np.asarray(g, dtype=float))
        self.sums.append(np.stack([y.sum(axis=1), (y * y).sum(axis=1), y @ g, y @ w], axis=1))

    def cross(self, k: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Σ x_a x_b over look k, per pair."""
        blk = self.blocks[k]
        if self.binary[k]:
            return np.bitwise_count(blk[a] & blk[b]).sum(axis=1, dtype=np.int64).astype(float)
        return np.einsum("ij,ij->i", blk[a], blk[b])

    def rows(self, k: int, idx: np.ndarray) -> np.ndarray:
        blk = self.blocks[k]
        if self.binary[k]:
            return np.unpackbits(blk[idx].view(np.uint8), axis=1, count=self.sizes[k]).astype(float)
        return blk[idx]

    def pair_sums(self, k: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per pair Σz, Σz², Σ g z, Σ w z over look k, with z = (x_a − x_b + 1)/2, and on a 0/1 look the counts of
        z = 1 and z = 0 (else None)."""
        s, size = self.sums[k], self.sizes[k]
        d = s[a] - s[b]  # Σd, Σ(x_a² − x_b²) (unused), Σ g d, Σ w d
        cross = self.cross(k, a, b)
        sum_d2 = s[a, 1] + s[b, 1] - 2.0 * cross
        sz = (d[:, 0] + size) / 2.0
        sz2 = (sum_d2 + 2.0 * d[:, 0] + size) / 4.0
        sgz = (d[:, 2] + self.g[k].sum()) / 2.0
        swz = (d[:, 3] + self.w[k].sum()) / 2.0
        if self.binary[k]:
            return sz, sz2, sgz, swz, s[a, 0] - cross, s[b, 0] - cross
        return sz, sz2, sgz, swz, None, None

    def state(self) -> dict[str, Any]:
        return {"blocks": [b.copy() for b in self.blocks], "binary": list(self.binary), "sizes": list(self.sizes),
                "w": [x.copy() for x in self.w], "g": [x.copy() for x in self.g], "sums": [x.copy() for x in self.sums]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ScoreStore:
        obj = cls()
        obj.binary, obj.sizes = [bool(x) for x in state["binary"]], [int(x) for x in state["sizes"]]
        obj.blocks = [np.asarray(b, dtype=np.uint64 if obj.binary[k] else float)
                      for k, b in enumerate(state["blocks"])]
        for f in ("w", "g", "sums"):
            setattr(obj, f, [np.asarray(x, dtype=float) for x in state[f]])
        return obj


def _sliced(engine: Any, lo: int, hi: int) -> Any:
    """A copy of ``engine`` holding its tests ``lo:hi`` (to absorb in slices), put back by :func:`_put`."""
    sub = object.__new__(type(engine))
    sub.__dict__.update({k: v for k, v in engine.__dict__.items() if k not in engine.FIELDS})
    for f in engine.FIELDS:
        setattr(sub, f, getattr(engine, f)[lo:hi].copy())
    return sub


def _put(engine: Any, lo: int, sub: Any) -> None:
    for f in engine.FIELDS:
        getattr(engine, f)[lo:lo + len(sub)] = getattr(sub, f)
    engine.n, engine.remaining = sub.n, sub.remaining


def feed_look(engine: Any, store: ScoreStore, k: int, a: np.ndarray, b: np.ndarray) -> None:
    """Look ``k`` of ``store`` into the tests of the pairs (a, b) (in the engine's order), in slices of pairs."""
    size = store.sizes[k]
    if len(engine) == 0:
        engine.n += size
        engine.remaining = 0.0 if engine.n == engine.n_total else max(engine.remaining - float(store.w[k].sum()), 0.0)
        return
    step = max(1, _CELLS // max(size, 1))
    n0, rem0 = engine.n, engine.remaining
    for lo in range(0, len(engine), step):
        hi = min(lo + step, len(engine))
        sub = _sliced(engine, lo, hi)
        sub.n, sub.remaining = n0, rem0
        if isinstance(engine, LookTests):
            sub.absorb_sums(store.w[k], *store.pair_sums(k, a[lo:hi], b[lo:hi]))
        else:
            z = (store.rows(k, a[lo:hi]) - store.rows(k, b[lo:hi]) + 1.0) / 2.0
            sub.absorb(z, store.w[k])
        _put(engine, lo, sub)


__all__ = ["ScoreStore", "feed_look"]
