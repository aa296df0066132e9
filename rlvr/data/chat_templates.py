"""The chat template a run renders with: the model tokenizer's own, or the recipe's ``data.chat_template_path`` (a
Jinja file, or a template shipped here by name), as TRL's ``chat_template_path`` and verl's ``custom_chat_template``
let a run replace it. The one template renders the prompts (:func:`rlvr.data.build_prompts`), every turn of a
multi-turn trajectory (:class:`rlvr.envs.tokens.ChatRenderer`), ``rlvr eval``'s prompts and trajectories, and is
saved with the run's policy (``RUN/final``, a checkpoint's ``trainer/hf``), so a served or evaluated policy renders
what it was trained on.

Shipped templates (:data:`BUILTIN`), for models whose own template cannot carry a multi-turn trajectory token for
token (:func:`rlvr.envs.tokens.check_template`):

- ``chatml``: ``<|im_start|>role\\n ... `` turns ended by the tokenizer's **eos token** (Qwen's ``<|im_end|>``
  where that is the eos), history never rewritten (earlier ``<think>`` blocks kept), tool results as Qwen2.5/Qwen3
  render them (a user turn of ``<tool_response>`` blocks); no ``tools`` variable: rlvr lists the tools in the
  system message (:func:`rlvr.tools.formats.describe_tools`, Hermes calls). The fix for a Qwen3-style template that
  strips earlier reasoning and for a template whose turn end is not the eos token (Llama-3 configs whose eos is
  ``<|end_of_text|>`` while turns end with ``<|eot_id|>``).
- ``mistral``: Mistral v3's layout (``[INST] ... [/INST]``, the reply then the eos token, ``[AVAILABLE_TOOLS]``,
  ``[TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]``) with three changes that make it extend a
  conversation: the tools listed before the *first* user message (v3 lists them before the last one, so every new
  user message moves them), the system message folded into the first user message (v3 folds it into the last one
  and drops it once a reply follows), and a reply rendered as sampled (v3 renders ``" " + content | trim`` and
  refuses a reply after a tool result unless it carries ``tool_calls``).

Reading ``data.chat_template_path`` (a name here, or a file) and setting it on a tokenizer:
:func:`rlvr.data.datasets.chat_template_text`, :func:`rlvr.data.datasets.with_chat_template`.
"""

from __future__ import annotations

KEY = "data.chat_template_path"
"""The recipe key that names the run's chat template."""

CHATML = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- eos_token + '\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + eos_token + '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

MISTRAL = (
    "{{- bos_token }}"
    "{%- set ns = namespace(first=true, system='') %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}{%- set ns.system = message.content + '\\n\\n' %}"
    "{%- elif message.role == 'user' %}"
    "{%- if ns.first and tools %}{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST] ' + (ns.system if ns.first else '') + message.content + '[/INST]' }}{%- set ns.first = false %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if message.tool_call_id is defined and message.tool_call_id %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + (message.content | tojson) + ', \"call_id\": ' + "
    "(message.tool_call_id | tojson) + '}[/TOOL_RESULTS]' }}"
    "{%- else %}{{- '[TOOL_RESULTS] ' + message.content + '[/TOOL_RESULTS]' }}{%- endif %}"
    "{%- elif message.role == 'assistant' %}{{- message.content + eos_token }}"
    "{%- else %}{{- '[INST] ' + message.content + '[/INST]' }}"
    "{%- endif %}{%- endfor %}"
)

BUILTIN: dict[str, str] = {"chatml": CHATML, "mistral": MISTRAL}
"""The templates shipped in rlvr, by the name ``data.chat_template_path`` gives (module docstring)."""
