"""A small causal transformer whose layers run one *segment* of a sequence at a time (Seq1F1B).

Each layer takes a segment of ``n_j`` positions starting at token ``offset`` plus, for attention
blocks, the keys and values of the earlier segments of the same sequence (the "past"):

* :class:`SegEmbedding`: ids [B, n_j] -> E_tok[ids] + E_pos[offset .. offset + n_j - 1];
* :class:`SegBlock` (pre-LN, as GPT-2): ``x += Attn(LN(x))``, ``x += MLP(LN(x))``; query position
  ``offset + i`` attends keys at positions ``<= offset + i`` among ``[past keys; own keys]``, so
  running segments in order with their pasts equals causal attention over the whole sequence;
  it returns the segment's own keys and values too;
* :class:`SegHead`: LayerNorm, then the vocabulary projection.

With one segment (offset 0, no past) this is an ordinary causal transformer: the single-process
reference the Seq1F1B runtime is checked against. No dropout: the comparison is exact.

The zoo's ``gpt`` has the same layers with the same parameter names (``tok``, ``pos``; ``ln1``,
``qkv``, ``proj``, ``ln2``, ``mlp``; ``norm``, ``proj``): :func:`segment_layers` runs its layers on
segments, sharing their parameters, which is how ``workbench train`` runs Seq1F1B on it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.sequence import Block, Decoder, GPTEmbedding


class SegEmbedding(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(offset, offset + ids.shape[1], device=ids.device))


class SegBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"model dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, offset: int = 0, past_k=(), past_v=()):
        """x [B, n, d] -> (y [B, n, d], k, v [B, heads, n, d/heads]); ``past_k/v``: earlier segments'."""
        b, n, d = x.shape
        q, k, v = (
            z.view(b, n, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=2)
        )
        keys, values = torch.cat([*past_k, k], dim=2), torch.cat([*past_v, v], dim=2)
        N = keys.shape[2]
        mask = torch.arange(N, device=x.device)[None, :] <= offset + torch.arange(n, device=x.device)[:, None]
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x)), k, v


class SegHead(nn.Module):
    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(h))


def segment_gpt(
    vocab: int = 128,
    context: int = 64,
    dim: int = 32,
    num_layers: int = 4,
    heads: int = 2,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> nn.ModuleList:
    """Embedding, ``num_layers`` :class:`SegBlock`, :class:`SegHead`; N(0, 0.02) weights from ``seed``."""
    torch.manual_seed(seed)
    layers = nn.ModuleList(
        [SegEmbedding(vocab, context, dim)] + [SegBlock(dim, heads) for _ in range(num_layers)] + [SegHead(dim, vocab)]
    )
    for m in layers.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
    return layers.to(dtype)


def flop_model(layers: nn.ModuleList) -> tuple[float, int, int]:
    """(P, L, d) of the Seq1F1B FLOP estimate: parameters outside the embedding, blocks, width."""
    blocks = [m for m in layers if isinstance(m, SegBlock)]
    P = sum(p.numel() for m in layers if not isinstance(m, SegEmbedding) for p in m.parameters())
    return float(P), len(blocks), blocks[0].qkv.in_features if blocks else 0


def _no_dropout(layer: nn.Module, i: int) -> None:
    p = max((m.p for m in layer.modules() if isinstance(m, nn.Dropout)), default=0.0)
    if p or getattr(layer, "dropout", 0.0):
        raise ValueError(
            f"layer {i} ({type(layer).__name__}) has dropout {p or layer.dropout}; segments run without "
            "dropout (a mask per segment would differ from the whole sequence's): build the model with "
            "dropout=0 (--model-option dropout=0)"
        )


def segment_layers(layers) -> nn.ModuleList:
    """The zoo gpt's layers (:class:`~workbench.models.sequence.GPTEmbedding`, ``Block``,
    ``Decoder``) as :class:`SegEmbedding` / :class:`SegBlock` / :class:`SegHead` holding the *same*
    submodules (parameters shared, names unchanged). ``ValueError`` (one line) for any other layer
    or for dropout > 0."""
    out = []
    for i, layer in enumerate(layers):
        _no_dropout(layer, i)
        with torch.device("meta"):  # the shells' own parameters are replaced below: allocate none
            seg: nn.Module
            if isinstance(layer, GPTEmbedding):
                seg = SegEmbedding(1, 1, 1)
                seg.tok, seg.pos = layer.tok, layer.pos
            elif isinstance(layer, Block):
                seg = SegBlock(layer.heads, layer.heads)
                seg.heads = layer.heads
                seg.ln1, seg.ln2, seg.qkv, seg.proj, seg.mlp = layer.ln1, layer.ln2, layer.qkv, layer.proj, layer.mlp
            elif isinstance(layer, Decoder):
                seg = SegHead(1, 1)
                seg.norm, seg.proj = layer.norm, layer.proj  # type: ignore[assignment]  # Identity where the head has no norm
            else:
                raise ValueError(
                    f"layer {i} ({type(layer).__name__}) cannot run on a segment of a sequence; schedules "
                    "with segments (Seq1F1B) train the zoo's causal transformer: --model gpt"
                )
        out.append(seg)
    return nn.ModuleList(out)
