"""Factories of models the zoo does not ship, for ``workbench train --model package.module:function``
and the "Your own model" examples: a torchvision-style ResNet-18, and a Hugging Face GPT-2 and Llama
built from their configs (no download; needs ``pip install transformers``). Each returns a plain ``nn.Module``
that :func:`workbench.profiling.layering.split` cuts into layers.
"""

from __future__ import annotations

from torch import nn

from workbench.models.resnet import resnet18


def resnet18_digits(width: int = 8) -> nn.Module:
    """ResNet-18 (torchvision's structure, in-place ReLU) for the 8x8 one-channel ``digits`` set."""
    return resnet18(num_classes=10, width=width, in_channels=1, small_input=True)


def gpt2_tiny(
    vocab_size: int = 128,
    n_layer: int = 2,
    n_embd: int = 32,
    n_head: int = 2,
    context: int = 64,
    *,
    tie_word_embeddings: bool = False,
) -> nn.Module:
    """``transformers.GPT2LMHeadModel`` from a small ``GPT2Config`` (dropout 0, no cache). Untied by
    default; a tied input/output embedding lives in the first and the last layer, which a pipeline
    puts in different stages: the runtime combines the two stages' gradients of it at every update
    (:mod:`workbench.runtime.executors.tied`), profiles count it once."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise ValueError(
            "gpt2_tiny needs the transformers package: pip install transformers "
            "(check first with pip install --dry-run that it keeps your torch)"
        ) from None
    cfg = GPT2Config(
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=context,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
    )
    return GPT2LMHeadModel(cfg)


def llama_tiny(
    vocab_size: int = 128,
    n_layer: int = 2,
    hidden: int = 32,
    n_head: int = 2,
    context: int = 64,
    *,
    tie_word_embeddings: bool = True,
) -> nn.Module:
    """``transformers.LlamaForCausalLM`` from a small ``LlamaConfig`` (RMSNorm, rotary positions,
    SwiGLU; no cache). Tied input/output embedding by default, as in Llama-3.2-1B: the first and the
    last stage of a pipeline both own it, and the runtime combines their gradients
    (:mod:`workbench.runtime.executors.tied`)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise ValueError("llama_tiny needs the transformers package: pip install transformers") from None
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        num_key_value_heads=n_head,
        max_position_embeddings=context,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg)
