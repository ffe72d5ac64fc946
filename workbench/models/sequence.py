"""Sequence models as layer lists: a GNMT-style encoder-decoder, S2VT, an AWD-LSTM-style LM, a GPT LM.

Every builder returns ``(layers, names)``. All tensors are batch-first. LSTM layers start from a
zero state for every batch (no hidden state carried between batches), so a layer's output depends
only on its input, as pipelining requires.

A PyTorch LSTM layer (one direction) with input size ``i`` and hidden size ``h`` has
``4h(i + h) + 8h`` parameters (four gates, input and recurrent weights, two bias vectors).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------------------- GNMT
class SourceEmbedding(nn.Module):
    """(src ids [B,S], tgt_in ids [B,T]) -> (E[src] [B,S,E], tgt_in)."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)

    def forward(self, x):
        src, tgt_in = x
        return self.embed(src), tgt_in


class EncoderLSTM(nn.Module):
    """(h [B,S,i], tgt_in) -> (h' [B,S,o], tgt_in) with h' = LSTM(h) (+ h when ``residual``).
    A bidirectional layer concatenates both directions: o = 2 * hidden."""

    def __init__(self, d_in: int, hidden: int, bidirectional: bool = False, residual: bool = False):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, batch_first=True, bidirectional=bidirectional)
        self.residual = residual

    def forward(self, x):
        h, tgt_in = x
        y, _ = self.lstm(h)
        return (y + h if self.residual else y), tgt_in


class TargetEmbedding(nn.Module):
    """(enc [B,S,H], tgt_in ids [B,T]) -> (enc, E[tgt_in] [B,T,E])."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)

    def forward(self, x):
        enc, tgt_in = x
        return enc, self.embed(tgt_in)


class AttentionDecoderLSTM(nn.Module):
    """Bottom decoder layer: d = LSTM(e); attention over the encoder states,
    a = softmax(d W enc^T / sqrt(H)), c = a enc. (enc, e) -> (enc, d, c)."""

    def __init__(self, d_in: int, hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, batch_first=True)
        self.query = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        enc, e = x
        d, _ = self.lstm(e)
        scores = self.query(d) @ enc.transpose(1, 2) / math.sqrt(enc.shape[-1])
        return enc, d, torch.softmax(scores, dim=-1) @ enc


class DecoderLSTM(nn.Module):
    """Upper decoder layer fed with [d; c]: d' = LSTM([d; c]) (+ d when ``residual``).
    (enc, d, c) -> (enc, d', c)."""

    def __init__(self, hidden: int, residual: bool):
        super().__init__()
        self.lstm = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.residual = residual

    def forward(self, x):
        enc, d, c = x
        y, _ = self.lstm(torch.cat([d, c], dim=-1))
        return enc, (y + d if self.residual else y), c


class Seq2SeqClassifier(nn.Module):
    """(enc, d, c) -> logits [B,T,V] = d W_out + b."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, x):
        _, d, _ = x
        return self.proj(d)


def gnmt(vocab_size: int = 32000, hidden: int = 1024, num_layers: int = 8):
    """GNMT-style encoder-decoder (Wu et al. 2016; PipeDream's GNMT-8/GNMT-16 have 4/8 layers on
    each side): source embedding, ``num_layers`` encoder LSTMs (the first bidirectional, residual
    connections from the third on), target embedding, ``num_layers`` decoder LSTMs (the first
    computes attention, which feeds every upper layer; residual from the third on), softmax
    projection. 2 * num_layers + 3 layers. Teacher forcing: the decoder reads ``tgt_in``."""
    if num_layers < 2:
        raise ValueError(f"gnmt needs num_layers >= 2 (encoder and decoder each), got {num_layers}")
    h = hidden
    layers = [SourceEmbedding(vocab_size, h), EncoderLSTM(h, h, bidirectional=True), EncoderLSTM(2 * h, h)]
    layers += [EncoderLSTM(h, h, residual=True) for _ in range(num_layers - 2)]
    layers += [TargetEmbedding(vocab_size, h), AttentionDecoderLSTM(h, h)]
    layers += [DecoderLSTM(h, residual=i >= 2) for i in range(1, num_layers)]
    layers.append(Seq2SeqClassifier(h, vocab_size))
    names = (
        ["src_embed"]
        + [f"enc{i + 1}" for i in range(num_layers)]
        + ["tgt_embed"]
        + [f"dec{i + 1}" for i in range(num_layers)]
        + ["classifier"]
    )
    return layers, names


# --------------------------------------------------------------------------------------- S2VT
class FrameEmbedding(nn.Module):
    """(frame features [B,T,F], word ids [B,T]) -> (features W + b [B,T,E], ids)."""

    def __init__(self, features: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(features, dim)

    def forward(self, x):
        feats, ids = x
        return self.proj(feats), ids


class WordLSTM(nn.Module):
    """(h [B,T,H], ids) -> LSTM([h; E[ids]]) [B,T,H]: the second layer, fed with the first layer's
    output and the word embedding."""

    def __init__(self, vocab: int, dim: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(hidden + dim, hidden, batch_first=True)

    def forward(self, x):
        h, ids = x
        return self.lstm(torch.cat([h, self.embed(ids)], dim=-1))[0]


def s2vt(vocab_size: int = 13000, features: int = 4096, dim: int = 500, hidden: int = 1000):
    """S2VT (Venugopalan et al., "Sequence to Sequence -- Video to Text", ICCV 2015): a stack of two
    LSTMs of ``hidden`` units unrolled over every time step (frames, then words); the first reads
    the frames' CNN features (VGG-16 fc7, ``features``) through a linear embedding to ``dim``, the
    second the first's output concatenated with a ``dim`` word embedding; a softmax over the
    vocabulary. The CNN is not trained (precomputed features, as S2VT trains). Inputs: (features
    [B,T,F], word ids [B,T]); 4 layers."""
    layers = [
        FrameEmbedding(features, dim),
        EncoderLSTM(dim, hidden),  # (v, ids) -> (LSTM(v), ids): the first layer, over the frames
        WordLSTM(vocab_size, dim, hidden),
        Decoder(hidden, vocab_size),
    ]
    return layers, ["frame_embed", "lstm1", "lstm2", "classifier"]


# ----------------------------------------------------------------------------------- AWD-LSTM
class TokenEmbedding(nn.Module):
    """ids [B,T] -> dropout(E[ids]) [B,T,E]."""

    def __init__(self, vocab: int, dim: int, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids):
        return self.drop(self.embed(ids))


class LSTMLayer(nn.Module):
    """h [B,T,i] -> dropout(LSTM(h)) [B,T,o]."""

    def __init__(self, d_in: int, d_out: int, dropout: float = 0.0):
        super().__init__()
        self.lstm = nn.LSTM(d_in, d_out, batch_first=True)
        self.drop = nn.Dropout(dropout)

    def forward(self, h):
        return self.drop(self.lstm(h)[0])


class Decoder(nn.Module):
    """h [B,T,d] -> logits [B,T,V] = LN?(h) W^T + b (LayerNorm first when ``norm``)."""

    def __init__(self, dim: int, vocab: int, norm: bool = False, bias: bool = True):
        super().__init__()
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()
        self.proj = nn.Linear(dim, vocab, bias=bias)

    def forward(self, h):
        return self.proj(self.norm(h))


def awd_lstm(
    vocab_size: int = 33278,
    emb: int = 400,
    hidden: int = 1150,
    num_layers: int = 3,
    dropout: float = 0.4,
    *,
    tie_weights: bool = False,
):
    """AWD-LSTM-style LM (Merity et al. 2018): embedding (``emb``), ``num_layers`` LSTMs
    (emb -> hidden -> ... -> emb), linear decoder to the vocabulary. Published: 24M parameters
    on PTB (10k vocab), 33M on WikiText-2 (33,278 vocab), with the decoder tied to the embedding.
    Tying is off by default (a tied weight would live in two pipeline stages); without it the
    decoder adds ``emb * vocab`` parameters. Not modelled: DropConnect on the recurrent weights
    (weight drop) and the other AWD regularizers; they change training, not compute or size."""
    dims = [emb] + [hidden] * (num_layers - 1) + [emb]
    embed = TokenEmbedding(vocab_size, emb, dropout)
    layers: list[nn.Module] = [embed]
    layers += [LSTMLayer(dims[i], dims[i + 1], dropout) for i in range(num_layers)]
    dec = Decoder(emb, vocab_size)
    if tie_weights:
        dec.proj.weight = embed.embed.weight
    layers.append(dec)
    names = ["embed"] + [f"lstm{i + 1}" for i in range(num_layers)] + ["decoder"]
    return layers, names


# ---------------------------------------------------------------------------------------- GPT
class GPTEmbedding(nn.Module):
    """ids [B,T] -> dropout(E_tok[ids] + E_pos[0..T-1]) [B,T,d]."""

    def __init__(self, vocab: int, context: int, dim: int, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.tok(ids) + self.pos(pos))


class Block(nn.Module):
    """Pre-LN transformer block: x += Attn(LN(x)) (causal, multi-head); x += MLP(LN(x)),
    MLP = W2 GELU(W1 x) with a 4d hidden layer."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"gpt model dim {dim} is not divisible by {heads} heads")
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln2(x))


def gpt(
    vocab_size: int = 50257,
    context: int = 1024,
    dim: int = 768,
    num_layers: int = 12,
    heads: int = 12,
    *,
    dropout: float = 0.1,
    tie_weights: bool = False,
):
    """GPT-2-style decoder-only transformer (Radford et al. 2019, "small": 12 x 768, 12 heads,
    1024 context, 50,257 vocab; 124M parameters with the output projection tied to the token
    embedding). Layers: embedding, ``num_layers`` blocks, final LayerNorm + projection.
    Untied by default (see :func:`awd_lstm`); untied adds ``vocab * dim`` parameters."""
    embed = GPTEmbedding(vocab_size, context, dim, dropout)
    layers: list[nn.Module] = [embed]
    layers += [Block(dim, heads, dropout) for _ in range(num_layers)]
    head = Decoder(dim, vocab_size, norm=True, bias=False)
    if tie_weights:
        head.proj.weight = embed.tok.weight
    layers.append(head)
    for layer in layers:
        for m in layer.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
    names = ["embed"] + [f"block{i}" for i in range(num_layers)] + ["head"]
    return layers, names
