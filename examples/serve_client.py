"""The client of docs/serve.md: a LoRA training client of `rlvr serve` (start it first), three cross_entropy steps
on one chat answer, then samples from the trained weights. Run: .venv/bin/python examples/serve_client.py"""

import os

import tinker
from tinker import types

os.environ.setdefault("TINKER_API_KEY", "tml-local")  # the SDK insists on a key starting "tml-"; the server takes any
sc = tinker.ServiceClient(base_url="http://127.0.0.1:8000")
tc = sc.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=16).result()
tok = tc.get_tokenizer()  # a server on 127.0.0.1 hands out its model folder: no hub needed

chat = [{"role": "user", "content": "What is 7 plus 5?"}, {"role": "assistant", "content": "7 plus 5 is 12."}]
prompt = tok.encode(tok.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=False), add_special_tokens=False)
full = tok.encode(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)
weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(full) - len(prompt))  # train on the answer only
datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={"target_tokens": full[1:], "weights": weights})

for step in range(3):
    fb = tc.forward_backward([datum], "cross_entropy")  # futures: submit both, then wait
    opt = tc.optim_step(types.AdamParams(learning_rate=3e-4))
    print(step, fb.result().metrics["loss:sum"], opt.result().metrics)

sampler = tc.save_weights_and_get_sampling_client().result()  # the trainer's weights onto the engines
out = sampler.sample(types.ModelInput.from_ints(prompt), 4,
                     types.SamplingParams(max_tokens=16, temperature=1.0, stop=[tok.eos_token_id])).result()
for seq in out.sequences:
    print(repr(tok.decode(seq.tokens)), seq.stop_reason)
sc.close("success").result()  # ends the session: its model is unloaded now rather than after the timeout
