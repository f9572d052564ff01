"""``gptzoo serve`` through the real ``openai`` client (and raw HTTP where the client would hide it):
completions and chats, streamed and not, greedy text equal to a solo generate, concurrent streams,
a disconnect freeing its row, OpenAI's error objects, and SIGTERM draining in-flight requests."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from server_process import Server  # noqa: E402

from gptzoo.fetch import fetch  # noqa: E402
from gptzoo.inference.generate import generate_text  # noqa: E402
from gptzoo.loader import load_any, with_adapter  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "smollm2-135m"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "import numpy as np\n",
    "The quick brown fox jumps over",
    "1, 2, 3, 4,",
    "Hello, my name is",
    "In 1492, Columbus",
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    running = Server(NAME)
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def solo() -> Any:
    loaded = load_any(NAME)
    model, tokenizer = loaded.model.eval(), loaded.tokenizer()

    def run(prompt: str | list[int], n: int) -> str:
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        (result,), _ = generate_text(model, tokenizer, [ids], n)
        return result.text

    run.tokenizer = tokenizer  # type: ignore[attr-defined]
    return run


def running(server: Server, sequences: int) -> bool:
    """Whether /health comes to count ``sequences`` running within 30 seconds."""
    for _ in range(300):
        if server.raw("GET", "/health")[1]["running"] == sequences:
            return True
        time.sleep(0.1)
    return False


def test_models_and_a_greedy_completion_equal_to_generate(server: Server, solo: Any) -> None:
    assert [m.id for m in server.client.models.list().data] == [NAME]
    reply = server.client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].text == solo(PROMPTS[0], 12)
    assert reply.choices[0].finish_reason == "length"
    prompt_tokens = len(solo.tokenizer.encode(PROMPTS[0]))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, 12)


def test_a_chat_renders_the_template_as_transformers_does(server: Server, solo: Any) -> None:
    import transformers

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    hf = transformers.AutoTokenizer.from_pretrained(str(fetch(NAME)))
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    reply = server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0)
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == solo(list(ids), 10)
    chunks = list(
        server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streaming_is_server_sent_events_ending_in_done(server: Server) -> None:
    body = {"model": NAME, "prompt": PROMPTS[5], "max_tokens": 8, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    status, _, text = server.raw("POST", "/v1/completions", json.dumps(body).encode())
    events = [e for e in text.split("\n\n") if e]
    assert status == 200 and all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    whole = server.client.completions.create(model=NAME, prompt=PROMPTS[5], max_tokens=8, temperature=0)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == whole.choices[0].text


def test_eight_concurrent_greedy_streams_each_equal_their_solo_generate(server: Server, solo: Any) -> None:
    def stream(prompt: str) -> str:
        chunks = server.client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(stream, PROMPTS))
    assert texts == [solo(p, 24) for p in PROMPTS]


def test_stop_n_seed_and_logprobs(server: Server, solo: Any) -> None:
    full = solo(PROMPTS[1], 20)
    stop = full[8:11]
    cut = server.client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = [
        server.client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=10, n=2, seed=7, temperature=1.0)
        for _ in range(2)
    ]
    assert [c.text for c in sampled[0].choices] == [c.text for c in sampled[1].choices]  # a seed repeats
    assert [c.index for c in sampled[0].choices] == [0, 1]
    scored = server.client.completions.create(
        model=NAME, prompt=PROMPTS[0], max_tokens=1, temperature=0, echo=True, logprobs=1
    )
    lp = scored.choices[0].logprobs
    prompt_tokens = len(solo.tokenizer.encode(PROMPTS[0]))
    assert scored.choices[0].text.startswith(PROMPTS[0]) and len(lp.tokens) == prompt_tokens + 1
    assert lp.token_logprobs[0] is None and all(x < 0 for x in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == scored.choices[0].text and lp.text_offset[1] == len(lp.tokens[0])


def test_bad_requests_get_openai_errors_and_the_server_lives(server: Server) -> None:
    bad = {
        "unknown model": ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
        "no prompt": ({"model": NAME}, 400, "prompt"),
        "max_tokens 0": ({"model": NAME, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        "absurd max_tokens": ({"model": NAME, "prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
        "max_tokens text": ({"model": NAME, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
        "prompt over the context": ({"model": NAME, "prompt": [1] * 9000}, 400, "prompt"),
        "unknown field": ({"model": NAME, "prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
        "temperature": ({"model": NAME, "prompt": "x", "temperature": 3}, 400, "temperature"),
        "token id": ({"model": NAME, "prompt": [10**7]}, 400, "prompt"),
        "empty messages": ({"model": NAME, "messages": []}, 400, "messages"),
    }
    for what, (body, status, param) in bad.items():
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        got, error, _ = server.raw("POST", path, json.dumps(body).encode())
        assert (got, error["error"]["param"]) == (status, param), what
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"], what
    status, error, _ = server.raw("POST", "/v1/completions", b"{not json")
    assert status == 400 and "could not parse the JSON body" in error["error"]["message"]
    status, error, _ = server.raw("POST", "/v1/completions", b"x" * (9 * 2**20))
    assert status == 413 and "bytes" in error["error"]["message"]
    status, error, _ = server.raw("GET", "/v1/completions")
    assert status == 405 and error["error"]["message"] == "GET is not allowed on /v1/completions"
    status, error, _ = server.raw("GET", "/nowhere")
    assert status == 404 and "/v1/chat/completions" in error["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        server.client.completions.create(model="gpt-4", prompt="x")
    assert server.client.completions.create(model=NAME, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_a_disconnect_frees_its_row(server: Server) -> None:
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 8000, "stream": True}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    first = response.readline()
    assert response.status == 200 and first.startswith(b"data: "), first
    assert server.raw("GET", "/health")[1] == {"status": "ok", "running": 1, "waiting": 0}, first
    connection.close()  # the client goes away 8000 tokens early
    assert running(server, 0), "the disconnected stream kept its row"


def test_a_disconnect_ends_a_request_that_is_not_streamed(server: Server) -> None:
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 8000}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    assert running(server, 1)
    connection.close()  # the client goes away long before 8000 tokens
    assert running(server, 0), "the disconnected request kept generating"


def test_a_large_request_does_not_stall_the_others(server: Server) -> None:
    """Tokenizing 3 MB of prompt takes seconds: /health answers meanwhile, before the request is refused."""
    body = json.dumps({"model": NAME, "prompt": "The quick brown fox jumps over the lazy dog. " * 70_000})
    answered: list[tuple[str, float, int]] = []

    def large() -> None:
        status = server.raw("POST", "/v1/completions", body.encode())[0]
        answered.append(("large", time.perf_counter(), status))

    asking = threading.Thread(target=large)
    asking.start()
    time.sleep(0.5)  # the body is sent and being tokenized
    status = server.raw("GET", "/health")[0]
    answered.append(("health", time.perf_counter(), status))
    asking.join(120)
    assert [(name, status) for name, _, status in sorted(answered, key=lambda a: a[1])] == [
        ("health", 200),
        ("large", 400),
    ]


def test_a_sampler_value_the_chain_cannot_use_is_a_400(server: Server) -> None:
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 4, "repetition_penalty": 1e-320}
    status, error, _ = server.raw("POST", "/v1/completions", json.dumps(body).encode())
    assert status == 400, error
    assert "repetition_penalty" in error["error"]["message"] and "NaN or infinity" in error["error"]["message"]
    assert server.client.completions.create(model=NAME, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_a_model_without_a_chat_template_refuses_chats() -> None:
    tiny = Server("gpt2-tiny", "--seed", "1")
    try:
        chat = {"model": "gpt2-tiny", "messages": [{"role": "user", "content": "hi"}]}
        status, error, _ = tiny.raw("POST", "/v1/chat/completions", json.dumps(chat).encode())
        assert status == 400 and "has no chat template" in error["error"]["message"]
        assert tiny.client.completions.create(model="gpt2-tiny", prompt="Hi", max_tokens=3).usage.completion_tokens == 3
    finally:
        assert tiny.stop() == 0


def test_sigterm_drains_a_request_in_flight() -> None:
    server = Server(NAME)
    results: list[Any] = []

    def ask() -> None:
        results.append(server.client.completions.create(model=NAME, prompt=PROMPTS[3], max_tokens=40, temperature=0))

    asking = threading.Thread(target=ask)
    asking.start()
    time.sleep(1.0)
    assert server.stop() == 0
    asking.join(60)
    assert len(results) == 1 and results[0].usage.completion_tokens == 40
    assert "Traceback" not in "".join(server.lines)


def test_sigterm_ends_while_a_client_holds_a_half_sent_body() -> None:
    tiny = Server("gpt2-tiny", "--seed", "1")
    held = socket.create_connection(("127.0.0.1", tiny.port))
    try:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
        held.sendall(f'{head}\r\n{{"model": '.encode())
        time.sleep(0.5)
        tiny.process.send_signal(signal.SIGTERM)
        assert tiny.process.wait(timeout=30) == 0
        assert b" 503 " in held.recv(4096).split(b"\r\n")[0]
    finally:
        held.close()
        if tiny.process.poll() is None:
            tiny.process.kill()
    assert "Traceback" not in "".join(tiny.lines)


def test_a_second_sigterm_ends_the_requests_in_flight() -> None:
    server = Server(NAME)
    results: list[tuple[int, Any]] = []

    def ask() -> None:
        body = json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 4000}).encode()
        results.append(server.raw("POST", "/v1/completions", body)[:2])

    asking = threading.Thread(target=ask)
    asking.start()
    assert running(server, 1)
    server.process.send_signal(signal.SIGTERM)  # drains: the request would run to its 4000 tokens
    time.sleep(0.5)
    server.process.send_signal(signal.SIGTERM)  # stops it
    assert server.process.wait(timeout=30) == 0
    asking.join(30)
    assert results and results[0][0] == 500 and "stopped before the sequence ended" in results[0][1]["error"]["message"]
    assert "Traceback" not in "".join(server.lines)


def peft_adapter(directory: Path, targets: list[str], seed: int) -> Path:
    """An adapter peft makes on SmolLM2-135M's ``targets``, with random nonzero B (so it changes the text)."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(fetch(NAME), dtype=torch.float32)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    adapted.save_pretrained(directory)
    return directory


def test_several_adapters_on_one_base_by_name(tmp_path: Path, solo: Any) -> None:
    first = peft_adapter(tmp_path / "first", ["q_proj", "v_proj"], 1)
    second = peft_adapter(tmp_path / "second", ["gate_proj", "up_proj", "down_proj"], 2)
    server = Server(NAME, "--adapter", f"first={first}", "--adapter", f"second={second}")
    try:
        assert [m.id for m in server.client.models.list().data] == [NAME, "first", "second"]
        asked = [(model, prompt) for model in (NAME, "first", "second") for prompt in PROMPTS[:2]]

        def complete(pair: tuple[str, str]) -> str:
            model, prompt = pair
            reply = server.client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
            return reply.choices[0].text

        with concurrent.futures.ThreadPoolExecutor(len(asked)) as pool:
            texts = dict(zip(asked, pool.map(complete, asked), strict=True))
    finally:
        assert server.stop() == 0
    tokenizer = solo.tokenizer
    for model, adapter in (("first", first), ("second", second)):
        adapted = with_adapter(load_any(NAME), adapter).model.eval()
        for prompt in PROMPTS[:2]:
            (alone,), _ = generate_text(adapted, tokenizer, [tokenizer.encode(prompt)], 16)
            assert texts[(model, prompt)] == alone.text, (model, prompt)
            assert alone.text != solo(prompt, 16)  # the adapter changes the text
    assert [texts[(NAME, p)] for p in PROMPTS[:2]] == [solo(p, 16) for p in PROMPTS[:2]]


def test_adapter_names_must_differ(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from cli_run import run_error

    message = run_error(capsys, "serve", NAME, "--adapter", f"{NAME}={tmp_path}")
    assert "names no model or one already served" in message
    message = run_error(capsys, "serve", NAME, "--adapter", str(tmp_path), "--adapter", str(tmp_path))
    assert "only one adapter can take MODEL's place" in message
