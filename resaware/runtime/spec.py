"""What a compiled module takes as input: a tensor's name, static shape and dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """A model input: name, full static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        """Name, shape and dtype as a dict."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        """The spec a `to_json` dict describes."""
        return cls(data["name"], tuple(int(d) for d in data["shape"]), data["dtype"])

    def random(self, rng: np.random.Generator) -> np.ndarray:
        """A random array of this shape and dtype (standard normal; small integers for integer inputs)."""
        if np.issubdtype(np.dtype(self.dtype), np.floating):
            return rng.standard_normal(self.shape).astype(self.dtype)
        return rng.integers(0, 8, size=self.shape).astype(self.dtype)
