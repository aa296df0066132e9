"""``tiny-random``: a seeded, randomly initialised tiny Llama with a character-level tokenizer.

It exists for fast tests (a GRPO learning test trains it on one-digit addition): it builds in seconds, loads in
transformers and in vLLM (CPU), and every token is one character, so rewards on short answers are easy to read.

Architecture (``TINY_CONFIG``): hidden 128, 2 layers, 2 attention heads of head_dim 64 (a head size vLLM's CPU
attention supports), 2 KV heads, SwiGLU intermediate 256, 512 positions, untied input/output embeddings,
V = ``len(VOCAB)`` = 50 tokens.

Tokenizer: ids 0-3 are ``<pad>``, ``<|im_start|>`` (bos), ``<|im_end|>`` (eos), ``<unk>``; then one id per
character of ``CHARS`` (digits, lowercase letters, space, ``+-*=?.,:`` and newline). Input is lower-cased first
(so "What is 7 plus 5?" encodes fully); any other character becomes ``<unk>``. The decoder joins characters with
nothing between them, so ``decode(encode(s)) == s`` for every lower-case ``s`` over ``CHARS``.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

PAD, BOS, EOS, UNK = "<pad>", "<|im_start|>", "<|im_end|>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
"""Special tokens, in id order 0..3."""
CHARS: str = string.digits + string.ascii_lowercase + " " + "+-*=?.,:" + "\n"
"""The 46 ordinary characters, in id order 4..49."""
VOCAB: dict[str, int] = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARS))}
"""Token -> id, V = 50 entries."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML without a default system message: ``<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n``."""

TINY_CONFIG: dict = {
    "vocab_size": len(VOCAB),
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": VOCAB[BOS],
    "eos_token_id": VOCAB[EOS],
    "pad_token_id": VOCAB[PAD],
}
"""LlamaConfig keyword arguments of the tiny model."""

INIT_STD = 0.02
"""Standard deviation of the normal init of every matrix (embeddings, projections, lm_head); norms start at 1."""


def build_tokenizer():
    """The character-level tokenizer as a ``transformers.PreTrainedTokenizerFast``, chat template included.

    Encoding: lower-case, split into single characters (newline included), look each up in ``VOCAB``
    (``<unk>`` when absent); special tokens written literally (``<|im_end|>``) are matched whole first.
    No bos/eos is added by ``encode``; the chat template writes the ChatML markers itself.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    # "[\s\S]": every character, newline included, becomes its own word.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate, no spaces between characters
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        model_max_length=TINY_CONFIG["max_position_embeddings"],
        padding_side="left",
    )


def build_model(seed: int = 0):
    """The tiny ``LlamaForCausalLM`` in float32, initialised from ``seed`` alone.

    Init (independent of transformers' own init code, so the weights depend only on torch's CPU normal
    generator): parameters in sorted-name order; names ending in ``norm.weight`` are ones, every other tensor is
    drawn from N(0, ``INIT_STD``^2) by one ``torch.Generator`` seeded with ``seed``.
    Parameters: 2 x (4 x 128^2 + 3 x 128 x 256 + 2 x 128) + 128 + 2 x 50 x 128 = 341,120.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY_CONFIG)
    config.architectures = ["LlamaForCausalLM"]
    model = init_weights(LlamaForCausalLM(config).to(torch.float32), seed)
    model.generation_config = GenerationConfig(
        bos_token_id=VOCAB[BOS], eos_token_id=VOCAB[EOS], pad_token_id=VOCAB[PAD]
    )
    return model


def init_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Initialise ``model`` in place from ``seed`` alone (:func:`build_model`'s init, for any architecture): its
    parameters in sorted-name order, ``*norm.weight`` ones, every other tensor N(0, ``INIT_STD``^2) from one
    ``torch.Generator`` seeded with ``seed`` (float32 draws, cast to each parameter's dtype). Returns ``model``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * INIT_STD)
    return model


def write_tiny_random(folder: Path, seed: int = 0) -> None:
    """Write the tiny model and tokenizer in Hugging Face format into ``folder`` (created; float32 safetensors).

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    chat_template.jinja (or the template inside tokenizer_config.json, by transformers version),
    rlvr_model.json (name and seed).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_model(seed).save_pretrained(folder, safe_serialization=True)
    build_tokenizer().save_pretrained(folder)
    _portable_tokenizer_class(folder)
    (folder / "rlvr_model.json").write_text(json.dumps({"name": "tiny-random", "seed": seed}) + "\n")


def _portable_tokenizer_class(folder: Path) -> None:
    """Name the tokenizer class ``PreTrainedTokenizerFast`` (transformers 5 writes ``TokenizersBackend``,
    which transformers 4 cannot resolve; both versions read the former)."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
