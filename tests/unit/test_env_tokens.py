"""Token-in/token-out between turns (rlvr.envs.tokens) with real tokenizers: the embedded model's ChatML template
extends the conversation (the ids of a 3-turn trajectory equal the whole conversation rendered at once), and a
template that drops earlier turns' reasoning (Qwen3-style) is detected, never silently drifted from."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rlvr.envs.tokens import ChatRenderer, check_template
from rlvr.models import resolve_model

# A Qwen3-style template written for this test: an assistant message before the last one loses its <think> block.
STRIP_THINK = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}{%- set c = m.content %}"
    "{%- if '</think>' in c and not loop.last %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))


def test_three_turns_equal_the_whole_conversation_rendered_at_once(tok):
    r = ChatRenderer(tok)
    eos = tok.eos_token_id
    assert (eos, tok.convert_ids_to_tokens(eos)) == (2, "<|im_end|>")
    conv = [{"role": "user", "content": "What is 7 plus 5?"}]
    ids = r.opening_ids(conv)
    replies = ["It is 13.", "Sorry: 11.", "It is 12."]
    feedback = ["incorrect, try again", "still incorrect"]
    mask = [0] * len(ids)
    for turn, text in enumerate(replies):
        sampled = r.encode(text) + [eos]  # what a model that wrote `text` and stopped sampled
        ids += sampled
        mask += [1] * len(sampled)
        if turn == len(replies) - 1:
            break
        b = r.between(conv, text, True, [{"role": "user", "content": feedback[turn]}])
        assert b.prefix_ok and b.reason is None
        # the turn separator the model did not sample ("\n" after <|im_end|>), the user's message, the header
        assert tok.decode(b.ids) == f"\n<|im_start|>user\n{feedback[turn]}<|im_end|>\n<|im_start|>assistant\n"
        ids += b.ids
        mask += [0] * len(b.ids)
        conv = conv + [{"role": "assistant", "content": text}, {"role": "user", "content": feedback[turn]}]
    whole = r.encode(r.render(conv + [{"role": "assistant", "content": replies[-1]}], generation_prompt=False))
    # the whole rendering ends with the last turn's closing "\n" after <|im_end|>, which was never sampled
    assert ids == whole[:-1] and tok.decode(whole[-1:]) == "\n"
    # the loss mask is 1 on exactly the sampled tokens: each reply's tokens and its eos
    assert sum(mask) == sum(len(r.encode(t)) + 1 for t in replies)
    sampled_ids = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(sampled_ids) == "<|im_end|>".join(replies) + "<|im_end|>"


def test_a_turn_cut_at_the_token_limit_gets_the_whole_closing(tok):
    r = ChatRenderer(tok)
    conv = [{"role": "user", "content": "Count to ten."}]
    b = r.between(conv, "one two thr", False, [{"role": "user", "content": "go on"}])
    assert b.prefix_ok
    assert tok.decode(b.ids) == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_strips_earlier_reasoning_is_detected(tok):
    tok2 = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok2.chat_template = STRIP_THINK
    r = ChatRenderer(tok2)
    conv = [{"role": "user", "content": "What is 7 plus 5?"}]
    plain = r.between(conv, "It is 12.", True, [{"role": "user", "content": "why?"}])
    assert plain.prefix_ok  # no reasoning to strip: the template extends the conversation
    b = r.between(conv, "<think>7+5=12</think>\nIt is 12.", True, [{"role": "user", "content": "why?"}])
    assert not b.prefix_ok and b.ids == []
    assert "rewrites earlier turns" in b.reason


def test_a_template_that_rewrites_the_reply_is_detected(tok):
    tok2 = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok2.chat_template = tok.chat_template.replace("message['content']", "message['content'] | trim")
    r = ChatRenderer(tok2)
    b = r.between([{"role": "user", "content": "hi"}], "  hello  ", True, [{"role": "user", "content": "ok"}])
    assert not b.prefix_ok and "rewrites the assistant's message" in b.reason


def test_no_chat_template_is_refused(tok):
    tok2 = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok2.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatRenderer(tok2)


def test_the_load_time_probe_refuses_a_template_that_strips_reasoning(tok):
    assert check_template(ChatRenderer(tok)) is None
    tok2 = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    tok2.chat_template = STRIP_THINK
    assert "rewrites earlier turns" in check_template(ChatRenderer(tok2))
