"""OpenAI request bodies read as OpenAI's API reads them (gptzoo.serve.requests), and `gptzoo serve`
without its extra."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from cli_run import run_error

import gptzoo
from gptzoo.errors import GptzooError
from gptzoo.serve.requests import ApiError, parse
from gptzoo.tokenizer import load_tokenizer

TOKENIZER = load_tokenizer("gpt2")


def read(body: Any, *, chat: bool = False, context: int = 64) -> Any:
    return parse(
        body, chat=chat, tokenizer=TOKENIZER, registry=gptzoo.get_registry(), model_names=("m",), context=context
    )


def refused(body: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        read(body, **kwargs)
    return caught.value


def test_prompts_in_every_form_and_the_defaults() -> None:
    request = read({"model": "m", "prompt": "Hello world"})
    assert request.prompts == [TOKENIZER.encode("Hello world")] and request.max_tokens == [16]
    assert request.n == 1 and request.stop == () and request.logprobs is None and not request.stream
    assert read({"model": "m", "prompt": [1, 2, 3]}).prompts == [[1, 2, 3]]
    assert read({"model": "m", "prompt": [[1, 2], [3]]}).prompts == [[1, 2], [3]]
    assert read({"model": "m", "prompt": ["a", "b"]}).prompts == [TOKENIZER.encode("a"), TOKENIZER.encode("b")]
    assert read({"model": "m", "prompt": [1] * 60}).max_tokens == [4]  # what the context leaves


def test_every_flagged_sampler_is_a_field_and_top_p_0_is_greedy() -> None:
    request = read({"model": "m", "prompt": "x", "temperature": 0.7, "top_k": 40, "min_p": 0.1})
    assert request.sampling["temperature"] == 0.7 and request.sampling["top_k"] == 40
    assert request.sampling["min_p"] == 0.1 and request.sampling["top_p"] is None
    greedy = read({"model": "m", "prompt": "x", "top_p": 0})
    assert greedy.sampling["top_p"] is None and greedy.sampling["temperature"] == 0


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        ({"model": "gpt-4", "prompt": "x"}, 404, "model", "The model `gpt-4` does not exist"),
        ({"prompt": "x"}, 400, "model", "you must provide a model parameter"),
        ({"model": "m", "prompt": "x", "best": 1}, 400, "best", "Unrecognized request argument supplied: best"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "Invalid 'max_tokens': 0"),
        ({"model": "m", "prompt": "x", "max_tokens": 64}, 400, "max_tokens", "maximum context length is 64 tokens"),
        ({"model": "m", "prompt": [1] * 64}, 400, "prompt", "you requested 65 tokens (64 in the prompt"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, 400, "max_tokens", "is not of type 'integer'"),
        ({"model": "m", "prompt": "x", "temperature": 2.5}, 400, "temperature", "between 0 and 2"),
        ({"model": "m", "prompt": "x", "temperature": "hot"}, 400, "temperature", "is not of type 'number'"),
        ({"model": "m", "prompt": "x", "n": 17}, 400, "n", "between 1 and 16"),
        ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
        ({"model": "m", "prompt": "x", "stop": [""]}, 400, "stop", "non-empty string"),
        ({"model": "m", "prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
        ({"model": "m", "prompt": "x", "logit_bias": {"1": 5}}, 400, "logit_bias", "not supported"),
        ({"model": "m", "prompt": "x", "stream_options": {}}, 400, "stream_options", "only allowed when"),
        ({"model": "m", "prompt": []}, 400, "prompt", "must be a string"),
        ({"model": "m", "prompt": [-1]}, 400, "prompt", "token id -1 is outside the vocabulary"),
        ({"model": "m", "prompt": "x", "logprobs": 21}, 400, "logprobs", "between 0 and 20"),
        ({"model": "m", "prompt": [[1]] * 20, "n": 16}, 400, "prompt", "ask for 320 sequences; one request takes at"),
        ([1, 2], 400, None, "must be a JSON object"),
    ],
)
def test_bad_fields_are_refused_as_openai_does(body: Any, status: int, param: str | None, message: str) -> None:
    error = refused(body)
    assert (error.status, error.param) == (status, param) and message in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_chats_take_text_parts_and_need_a_template() -> None:
    with pytest.raises(GptzooError, match="has no chat template"):
        read({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, chat=True)
    assert (
        refused({"model": "m", "messages": [{"role": "user", "content": 3}]}, chat=True).param == "messages.[0].content"
    )
    assert refused({"model": "m", "messages": [{"content": "x"}]}, chat=True).param == "messages.[0]"
    assert refused({"model": "m", "prompt": "x", "messages": []}, chat=True).param == "prompt"  # not a chat field
    error = refused({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, chat=True)
    assert error.param == "top_logprobs" and "needs 'logprobs'" in error.message


def test_serve_without_its_extra_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    message = run_error(capsys, "serve", "gpt2-tiny")
    assert message.endswith(
        "gptzoo serve needs starlette and uvicorn (uvicorn is missing): pip install 'gptzoo[serve]'"
    )
    assert "is not a port" in run_error(capsys, "serve", "gpt2-tiny", "--port", "70000")
