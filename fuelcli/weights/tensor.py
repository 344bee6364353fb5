"""The one in-memory weight type: raw bytes in the checkpoint's own format."""

from dataclasses import dataclass

import numpy as np

from ..formats import FORMATS, Format


@dataclass(frozen=True)
class Tensor:
    """A weight kept in its stored format.

    `shape` is the logical numpy shape, last axis = a row (e.g. (out, in), (experts, out, in)).
    `data` is uint8 with shape shape[:-1] + (row_bytes,), C-contiguous, usually a view of an mmap,
    so a bf16 or Q4_K checkpoint stays bf16 or Q4_K in memory; kernels decode rows on the fly.
    `columns`: the stored columns' order where it is not the model's (a regroup of columns that
    would split the format's blocks): the product is W @ x[..., columns], the input moved instead
    of the weight; None: the model's order.
    """

    name: str
    fmt: str
    shape: tuple
    data: np.ndarray
    columns: np.ndarray | None = None

    @property
    def format(self) -> Format:
        return FORMATS[self.fmt]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))
