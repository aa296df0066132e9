"""A Tinker client that disappears (for tests/unit/test_serve_api.py): run as ``python serve_dropper.py URL``.

It creates a LoRA training client on the server at URL, keeping its session alive with its own quick heartbeats
(the SDK's come every 10 s; the test's server ends a session after 3 s without one), prints ``model <id>``, submits
a large ``forward_backward`` and prints ``submitted``, then waits to be killed (the test sends SIGKILL).
"""

from __future__ import annotations

import sys
import threading
import time


def main(url: str) -> None:
    import httpx
    import tinker
    from tinker import types

    sc = tinker.ServiceClient(base_url=url)
    sid = sc.holder.get_session_id()

    def beat() -> None:
        with httpx.Client(base_url=url, timeout=5) as http:
            while True:
                try:
                    http.post("/api/v1/session_heartbeat", json={"session_id": sid})
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)

    threading.Thread(target=beat, daemon=True).start()
    tc = sc.create_lora_training_client(base_model="tiny-random", rank=2).result()
    print("model", tc.get_info().model_id, flush=True)
    toks = [(5 + k) % 40 + 4 for k in range(60)]
    data = [types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                        loss_fn_inputs={"target_tokens": toks[1:], "weights": [1.0] * 59}) for _ in range(64)]
    tc.forward_backward(data, "cross_entropy")
    print("submitted", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1])
