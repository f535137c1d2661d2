"""A small paged KV cache laid out the way SGLang's MHA token pool does it:
one K and one V tensor per layer, [pages * page_size, heads, head_dim], a page
being page_size consecutive tokens. Shared by the prefill (test) and decode
(peer.py) sides so both compute the same expected values."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    layers: int = 4
    pages: int = 64
    page_size: int = 16
    heads: int = 2
    head_dim: int = 64
    dtype: str = "float16"

    @property
    def buffers(self) -> int:
        return 2 * self.layers  # K and V per layer

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.heads * self.head_dim * torch.empty(
            0, dtype=getattr(torch, self.dtype)).element_size()

    def values(self, seed: int, index: int) -> torch.Tensor:
        """The prefill contents of buffer `index` (deterministic in seed)."""
        g = torch.Generator().manual_seed(seed * 1000 + index)
        shape = (self.pages * self.page_size, self.heads, self.head_dim)
        return torch.randn(shape, generator=g).to(getattr(torch, self.dtype))

    def allocate(self, fill: int | None) -> list[torch.Tensor]:
        """The 2*layers buffers: zeros, or the values for seed `fill`."""
        if fill is not None:
            return [self.values(fill, i) for i in range(self.buffers)]
        shape = (self.pages * self.page_size, self.heads, self.head_dim)
        return [torch.zeros(shape, dtype=getattr(torch, self.dtype)) for _ in range(self.buffers)]

    def page(self, t: torch.Tensor, p: int) -> torch.Tensor:
        return t[p * self.page_size:(p + 1) * self.page_size]

    def check(self, kv: list[torch.Tensor], seed: int, mapping: dict[int, int]) -> list[str]:
        """Problems found in decode buffers `kv` that should hold prefill page
        mapping[d] at decode page d and zeros elsewhere (empty list: all good)."""
        problems = []
        for i, t in enumerate(kv):
            expected = self.values(seed, i)
            for d in range(self.pages):
                got = self.page(t, d)
                want = self.page(expected, mapping[d]) if d in mapping else torch.zeros_like(got)
                if not torch.equal(got, want):
                    problems.append(f"buffer {i} page {d}")
        return problems[:20]


def contiguous_runs(src_pages: list[int], dst_pages: list[int]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, count) runs of pages consecutive on both sides."""
    runs = []
    for s, d in zip(src_pages, dst_pages):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs
