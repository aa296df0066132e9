"""A character-level tokenizer (one id per printable character, each special marker one id) with the chat templates
of three tool-calling families, so every id of a tool trajectory can be worked out by hand.

- ``QWEN``: Qwen2.5-Instruct's template (Hermes calls), as published, minus the assistant-with-``tool_calls``
  branch (rlvr renders assistant turns as the sampled text);
- ``LLAMA``: Llama-3.1's layout, shortened (tools listed in the first user message, tool results under the
  ``ipython`` header, ``<|eot_id|>`` ends a turn);
- ``MISTRAL``: Mistral v3's layout, shortened (``[AVAILABLE_TOOLS]`` before the last user message,
  ``[TOOL_RESULTS]``, no generation prompt);
- ``MISTRAL_IDS``: ``MISTRAL`` with v3's tool results: ``{"content": ..., "call_id": ...}``, refusing a tool message
  without a 9-character ``tool_call_id`` (as the published v3 template does).
"""

import string

QWEN = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' and loop.first and tools %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, respond with a JSON for a "
    "function call with its proper arguments.\\n\\n' }}{%- for t in tools %}{{- t | tojson }}{{- '\\n\\n' }}"
    "{%- endfor %}{{- message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + "
    "'<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

MISTRAL = (
    "{{- bos_token }}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and loop.index0 == ns.last_user %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + "
    "'[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST]' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' }}"
    "{%- elif message.role == 'assistant' %}{{- message.content + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

MISTRAL_IDS = MISTRAL.replace(
    "{{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' }}",
    "{%- if message.tool_call_id is not defined or message.tool_call_id|length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- '[TOOL_RESULTS]{\"content\": ' + message.content|string + ', \"call_id\": \"' + message.tool_call_id + "
    "'\"}[/TOOL_RESULTS]' }}")
assert MISTRAL_IDS != MISTRAL

SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
VOCAB = {t: i for i, t in enumerate(SPECIALS + CHARS)}


def ids(text: str) -> list[int]:
    """Hand tokenisation: each special marker one id, every other character one id
    (:func:`tests.unit.test_env_turns.hand_ids` on this vocabulary)."""
    from tests.unit.test_env_turns import hand_ids

    return hand_ids(text, VOCAB, SPECIALS)


def tokenizer(template: str, bos: str, eos: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token="<pad>",
                                   chat_template=template)
