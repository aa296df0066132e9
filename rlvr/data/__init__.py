"""Prompt data: sources -> rows (question, gold) -> templated, tokenized prompts; the resumable sampler."""

from rlvr.data.datasets import (
    build_prompts,
    format_gold,
    gsm8k_gold,
    load_rows,
    render_prompt,
    resolve_data_path,
)
from rlvr.data.generated import generated_rows, generated_split
from rlvr.data.sampler import PromptSampler

__all__ = [
    "PromptSampler",
    "build_prompts",
    "format_gold",
    "generated_rows",
    "generated_split",
    "gsm8k_gold",
    "load_rows",
    "render_prompt",
    "resolve_data_path",
]
