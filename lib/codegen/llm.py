"""LLM providers: the prompt that states a kernel's contract, the code block
taken from an answer, and the clients that ask for it.

An LLM's kernel is held to the same contract as the template's: the same
``extern "C"`` signature (read from ``kernels/<kind>.cu``), the same semantics,
launch convention and bounds handling (:data:`KIND_CONTRACTS`), and it is
checked against the same NumPy reference. Whatever it answers is untrusted:
the plane (:mod:`lib.codegen.plane`) puts it through Gate 2a, NVRTC and the
spot check, and falls back to the template on any failure.

Providers (:func:`make_provider`), each answering ``ask(prompt) -> str``:

==================  =====================================================
name                client, model, key
==================  =====================================================
``openai``          official SDK, Responses API; ``$GPUHIVE_OPENAI_MODEL``;
                    ``$OPENAI_API_KEY``
``anthropic``       official SDK, Messages API; ``$GPUHIVE_ANTHROPIC_MODEL``;
                    ``$ANTHROPIC_API_KEY``
``openai-compatible``  chat completions at any base URL
                    (``$GPUHIVE_COMPAT_BASE_URL``); ``$GPUHIVE_COMPAT_MODEL``;
                    ``$GPUHIVE_COMPAT_API_KEY`` (or ``$OPENAI_API_KEY``)
``recorded``        stored answers replayed from a JSON file (label RECORDED)
==================  =====================================================

Keys are read by the SDKs from the environment (or passed in) and never
logged, stored in the cache or put in a message. Each request is held to
:data:`DEADLINE_S` in all (a read's timeout alone lets a trickling server
hold it for ever), and its answer to :data:`MAX_ANSWER_TOKENS`; past either,
the plane falls back to the template as on any failed request.

Why one module: the prompt (its contract text and :data:`PROMPT_VERSION`,
which keys the cache), the code block taken from an answer and the clients
that ask for it change together. A new provider is a client here and
nothing else; a new kind is a contract here and the block it asks for.
Apart, a prompt could change under a cached answer, or a client parse an
answer the extractor would not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lib.codegen.specialise import (
    CodegenError,
    entry_name,
    kernel_path,
    single_kernel,
    tunables,
)
from lib.contract import Decision, TaskSpec

PROMPT_VERSION = 1
"""Bumped whenever the prompt changes; part of every LLM cache key."""

RECORDED_PATH = Path(__file__).resolve().parent / "recorded" / "answers.json"
CODE_LANGUAGES = frozenset({"", "cuda", "cu", "c++", "cpp", "c"})
_FENCE_RE = re.compile(r"^```[ \t]*([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)

KIND_CONTRACTS: dict[str, str] = {
    "matmul": (
        "C[M x N] = A[M x K] . B[K x N], all row-major and contiguous. Grid is "
        "2-D: (ceil(N/MATMUL_TILE), ceil(M/MATMUL_TILE), 1); block (bx, by) "
        "computes the MATMUL_TILE x MATMUL_TILE tile of C at rows by*TILE.., "
        "columns bx*TILE... Any M, N, K >= 1: every load and store is bounds-"
        "checked. Accumulate in float; round once when storing C. Mark the "
        "kernel __launch_bounds__(MATMUL_MAX_THREADS) between void and its name."
    ),
    "reduce": (
        "Partial sums of x[0..n): 1-D grid of G blocks (any G >= 1) with a "
        "grid-stride loop; block b writes the float sum of its share to out[b] "
        "(out holds G floats; the host adds them). Accumulate in float. The "
        "block's static shared memory is sized REDUCE_MAX_THREADS floats."
    ),
    "elementwise": (
        "out[i] = a * x[i] + y[i] for i in [0, n): 1-D grid of any G >= 1 "
        "blocks with a grid-stride loop; a is a float; compute in float, round "
        "once when storing."
    ),
    "stencil": (
        "One Jacobi sweep of the 5-point stencil on an H x W row-major band: "
        "interior out[i][j] = 0.25 * (in[i-1][j] + in[i+1][j] + in[i][j-1] + "
        "in[i][j+1]), summed in that order; points with i == 0, i == H-1, "
        "j == 0 or j == W-1 are copied from in. 1-D grid of any G >= 1 blocks: "
        "block b handles rows b, b+G, ...; its threads stride along the row."
    ),
    "histogram": (
        "Adds to counts[0..B) the number of x[i] (i in [0, n)) in each of B "
        "equal bins over [0, 1): bin = min(max((int)(x * B), 0), B - 1) with "
        "x * B a float product; NaN or below 0 goes to bin 0, at or above B to "
        "bin B - 1. The host zeroes counts first; the kernel adds with "
        "atomicAdd. 1-D grid of any G >= 1 blocks with a grid-stride loop; up "
        "to HISTOGRAM_MAX_BINS bins may be privatised in static shared memory."
    ),
}
"""What each kind's kernel computes, how it is launched and its bounds rules."""


def signature(kind: str, dtype: str) -> str:
    """The ``extern "C"`` declaration of ``<kind>_<dtype>``, read from the
    kernel file (so the prompt never restates it)."""
    entry = entry_name(kind, dtype)
    text = single_kernel(kernel_path(kind).read_text(), entry)
    start = text.index('extern "C"')
    head = text[start:text.index("{", start)]
    return re.sub(r"\s+", " ", head).strip()


def build_prompt(task: TaskSpec, decision: Decision) -> str:
    """The prompt for ``task``'s kernel under ``decision``: contract and rules."""
    defines = tunables(task, decision)
    macros = "".join(f"#define {k} {v}\n" for k, v in sorted(defines.items()))
    return f"""Write one CUDA C++ kernel.

Entry point (exactly this signature, extern "C", no other __global__ function):
    {signature(task.kind, task.dtype)}

What it computes: {KIND_CONTRACTS[task.kind]}

Element type {task.dtype}: fp16 is __half (cuda_fp16.h), bf16 is __nv_bfloat16
(cuda_bf16.h); widen 16-bit values to float when reading, round to nearest
even when storing.
Launch: a 1-D block of {decision.block} threads (read blockDim.x; do not assume
it), no dynamic shared memory. Sizes need not be multiples of anything; indices
that can pass 2^31 are 64-bit (long long).
The source starts with these lines; keep them:
{macros or "(no macros)"}
Rules: include only <cuda_fp16.h> and <cuda_bf16.h>; no printf, malloc/free,
new/delete, assert, __trap, inline asm, function pointers, device-side launches,
#line, _Pragma, extern __shared__, system or file calls; #pragma only unroll.

Answer with exactly one fenced code block (```cuda) holding the whole source,
and nothing else.
"""


def extract_code(answer: object) -> tuple[str | None, str]:
    """The one code block of an LLM answer: ``(code, "")`` or ``(None, reason)``.

    Exactly one fenced block is required, in a C/C++/CUDA language or none;
    zero blocks, two or more blocks, an empty block or an empty answer are
    rejected with the reason.
    """
    if not isinstance(answer, str) or not answer.strip():
        return None, "the answer is empty"
    blocks = _FENCE_RE.findall(answer)
    if len(blocks) != 1:
        return None, (f"the answer holds {len(blocks)} fenced code blocks; "
                      "exactly one is required")
    language, code = blocks[0]
    language = language.strip().lower()
    if language not in CODE_LANGUAGES:
        return None, f"the code block is {language!r}, not CUDA C++"
    if not code.strip():
        return None, "the code block is empty"
    return code, ""


# ---- providers ------------------------------------------------------------------

class Provider(Protocol):
    """An LLM source of kernel text."""

    name: str
    model: str
    label: str

    def ask(self, prompt: str, task: TaskSpec) -> str:
        """The raw answer to ``prompt`` (raises on a transport error)."""
        ...


#: The most tokens an answer may have (a kernel is a few hundred; the rest is
#: room for a model that reasons before it answers, on the Responses API
#: counted in the same limit). Bounds what one request can cost.
MAX_ANSWER_TOKENS = 8192
#: Seconds one request may take in all, retries included. The SDKs' timeout
#: bounds each read, not the whole: a server that trickles its answer a few
#: bytes a second holds a request for as long as it likes.
DEADLINE_S = 300.0


def _within(deadline: float, who: str, call: Callable[[], Any],
            close: Callable[[], None]) -> Any:
    """``call()``, or :class:`CodegenError` once ``deadline`` seconds have
    passed without its answer: the request runs in a thread of its own, and
    ``close`` (the client's) then ends its connection, so the thread stops
    at its next read. What ``call`` raises is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"{who} request", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        try:
            close()
        except Exception:
            pass  # the connection is being dropped either way
        raise CodegenError(f"{who}: no whole answer within {deadline:g} s, the "
                           "deadline of one request (retries included); the "
                           "server is stalling or trickling it")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _setting(value: str | None, env: str, what: str) -> str:
    found = value or os.environ.get(env, "")
    if not found:
        raise CodegenError(f"no {what}: pass it or set ${env}")
    return found


@dataclass
class OpenAIProvider:
    """OpenAI Responses API (``client.responses.create``).

    Args:
        model: model name; default ``$GPUHIVE_OPENAI_MODEL``.
        base_url: API base URL; default the SDK's (``$OPENAI_BASE_URL`` or
            OpenAI's).
        api_key: default ``$OPENAI_API_KEY`` (read by the SDK).
        timeout: seconds a read may wait. max_retries: SDK retries.
        deadline: seconds the whole request may take (:data:`DEADLINE_S`).
        max_tokens: answer limit (``max_output_tokens``, reasoning included).
    """

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 120.0
    max_retries: int = 2
    deadline: float = DEADLINE_S
    max_tokens: int = MAX_ANSWER_TOKENS
    name = "openai"
    label = "LLM"

    def __post_init__(self) -> None:
        self.model = _setting(self.model, "GPUHIVE_OPENAI_MODEL", "OpenAI model")

    def _client(self) -> Any:
        import openai

        try:
            return openai.OpenAI(api_key=self.api_key, base_url=self.base_url,
                                 timeout=self.timeout, max_retries=self.max_retries)
        except openai.OpenAIError as exc:
            raise CodegenError(f"OpenAI client not configured ({exc}); set "
                               "$OPENAI_API_KEY") from None

    def ask(self, prompt: str, task: TaskSpec) -> str:
        client = self._client()
        response = _within(self.deadline, self.name, lambda: client.responses.create(
            model=self.model, input=prompt, max_output_tokens=self.max_tokens),
            client.close)
        return response.output_text or ""


@dataclass
class AnthropicProvider:
    """Anthropic Messages API (``client.messages.create``).

    Args:
        model: default ``$GPUHIVE_ANTHROPIC_MODEL``. api_key: default
            ``$ANTHROPIC_API_KEY`` (read by the SDK). max_tokens: answer limit.
        timeout: seconds a read may wait; deadline: seconds the whole
            request may take (:data:`DEADLINE_S`).
    """

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 120.0
    max_retries: int = 2
    deadline: float = DEADLINE_S
    max_tokens: int = MAX_ANSWER_TOKENS
    name = "anthropic"
    label = "LLM"

    def __post_init__(self) -> None:
        self.model = _setting(self.model, "GPUHIVE_ANTHROPIC_MODEL",
                              "Anthropic model")

    def ask(self, prompt: str, task: TaskSpec) -> str:
        import anthropic

        api_key = self.api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise CodegenError("Anthropic client not configured; set "
                               "$ANTHROPIC_API_KEY")
        client = anthropic.Anthropic(api_key=api_key, base_url=self.base_url,
                                     timeout=self.timeout,
                                     max_retries=self.max_retries)
        message = _within(self.deadline, self.name, lambda: client.messages.create(
            model=self.model, max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": prompt}]), client.close)
        return "".join(b.text for b in message.content
                       if getattr(b, "type", "") == "text")


@dataclass
class OpenAICompatibleProvider:
    """Chat completions at any OpenAI-compatible base URL (vLLM, Ollama, ...).

    Args:
        base_url: default ``$GPUHIVE_COMPAT_BASE_URL`` (required).
        model: default ``$GPUHIVE_COMPAT_MODEL``.
        api_key: default ``$GPUHIVE_COMPAT_API_KEY``, then ``$OPENAI_API_KEY``,
            then ``"none"`` (local servers often want none).
        timeout: seconds a read may wait; deadline: seconds the whole
            request may take (:data:`DEADLINE_S`); max_tokens: answer limit.
    """

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 120.0
    max_retries: int = 2
    deadline: float = DEADLINE_S
    max_tokens: int = MAX_ANSWER_TOKENS
    name = "openai-compatible"
    label = "LLM"

    def __post_init__(self) -> None:
        self.model = _setting(self.model, "GPUHIVE_COMPAT_MODEL",
                              "OpenAI-compatible model")
        self.base_url = _setting(self.base_url, "GPUHIVE_COMPAT_BASE_URL",
                                 "OpenAI-compatible base URL")

    def ask(self, prompt: str, task: TaskSpec) -> str:
        import openai

        key = (self.api_key or os.environ.get("GPUHIVE_COMPAT_API_KEY")
               or os.environ.get("OPENAI_API_KEY") or "none")
        client = openai.OpenAI(api_key=key, base_url=self.base_url,
                               timeout=self.timeout, max_retries=self.max_retries)
        completion = _within(
            self.deadline, self.name, lambda: client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens,
                messages=[{"role": "user", "content": prompt}]), client.close)
        if not completion.choices:
            return ""
        return completion.choices[0].message.content or ""


#: The most bytes an answers file may hold (16 MiB).
MAX_ANSWERS_BYTES = 16 << 20
#: The string fields every recorded answer has (``model`` and ``note`` may too).
ANSWER_FIELDS = ("id", "kind", "dtype", "answer")


def read_answers(path: Path | str, raw: bytes | None = None
                 ) -> list[dict[str, Any]]:
    """The answers of a recorded-answers file (see :class:`RecordedProvider`),
    from ``raw`` where the caller has read the file, else read here.

    Raises:
        CodegenError: one line naming the file: missing, not a regular file,
            too large, not UTF-8 JSON, or not ``{"answers": [...]}`` with the
            :data:`ANSWER_FIELDS` as strings and unique ids.
    """
    where = f"answers file {path}"
    if raw is None:
        raw = _answer_bytes(path)
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CodegenError(f"{where}: not UTF-8 text (byte at offset "
                           f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CodegenError(f"{where}: not valid JSON: {exc.msg} at line "
                           f"{exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # 4300+ digits, deep nesting
        raise CodegenError(f"{where}: not valid JSON: {str(exc)[:80]}") from None
    answers = obj.get("answers") if isinstance(obj, dict) else None
    if not isinstance(answers, list):
        raise CodegenError(f'{where}: expected {{"answers": [...]}}')
    seen: set[str] = set()
    for i, a in enumerate(answers):
        missing = [f for f in ANSWER_FIELDS
                   if not isinstance(a, dict) or not isinstance(a.get(f), str)]
        if missing:
            raise CodegenError(f"{where}: answers[{i}] lacks the string field(s) "
                               f"{', '.join(missing)}")
        if a["id"] in seen:
            raise CodegenError(f"{where}: answer id {a['id']!r} appears twice")
        seen.add(a["id"])
    return answers


def _answer_bytes(path: Path | str) -> bytes:
    """The bytes of an answers file: a regular file (a FIFO opens without
    blocking, then is refused) of at most :data:`MAX_ANSWERS_BYTES`."""
    where = f"answers file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as exc:
        raise CodegenError(f"{where}: {getattr(exc, 'strerror', None) or exc}"
                           ) from None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CodegenError(f"{where}: not a regular file")
        raw = fh.read(MAX_ANSWERS_BYTES + 1)
    if len(raw) > MAX_ANSWERS_BYTES:
        raise CodegenError(f"{where}: larger than {MAX_ANSWERS_BYTES >> 20} MiB")
    return raw


@dataclass
class FixedAnswer:
    """A provider whose answer is the given code, in a code block: an answer
    written by hand (or by an attacker) pushed through the plane as an LLM's
    would be. The injection suite's end-to-end cases use it."""

    code: str
    name: str = "fixed"
    model: str = "fixed"
    label: str = "LLM"

    def ask(self, prompt: str, task: TaskSpec) -> str:
        return f"```cuda\n{self.code}\n```"


@dataclass
class RecordedProvider:
    """Replays stored LLM answers (label RECORDED): no network, no key.

    The file is JSON, ``{"answers": [{"id", "kind", "dtype", "model", "note",
    "answer"}, ...]}`` (``model`` and ``note`` optional; ids unique). ``ask``
    returns the answer named by ``answer_id``, else the first one recorded for
    the task's kind and dtype.

    Args:
        path: the JSON file; default ``lib/codegen/recorded/answers.json``.
        answer_id: which answer to replay; default by kind and dtype.
        raw: the file's bytes where the caller has already read them (the
            command line reads every input file through one helper).

    Raises:
        CodegenError: the file cannot be read as answers
            (:func:`read_answers`), or it holds no ``answer_id`` (the message
            lists the ids it holds).
    """

    path: Path | str = RECORDED_PATH
    answer_id: str | None = None
    raw: bytes | None = field(default=None, repr=False)
    name = "recorded"
    label = "RECORDED"

    def __post_init__(self) -> None:
        raw = self.raw if self.raw is not None else _answer_bytes(self.path)
        self.answers = read_answers(self.path, raw)
        self._digest = hashlib.sha256(raw).hexdigest()[:8]
        self.raw = None  # parsed; the digest stands for the bytes
        if self.answer_id is not None and self.answer_id not in self.ids:
            raise CodegenError(f"no recorded answer {self.answer_id!r} in "
                               f"{self.path}; its ids: "
                               f"{', '.join(self.ids) or '(none)'}")

    @property
    def ids(self) -> list[str]:
        """The ids of the answers in the file, in order."""
        return [a["id"] for a in self.answers]

    @property
    def model(self) -> str:
        # The file's digest: editing the answers invalidates their cache entries.
        return f"recorded:{self.answer_id or 'by-kind'}@{self._digest}"

    def find(self, task: TaskSpec) -> dict[str, Any]:
        """The stored answer record replayed for ``task``."""
        for a in self.answers:
            if self.answer_id is not None:
                if a["id"] == self.answer_id:
                    return a
            elif a["kind"] == task.kind and a["dtype"] == task.dtype:
                return a
        raise CodegenError(f"no recorded answer for {task.kind} {task.dtype} in "
                           f"{self.path}")

    def ask(self, prompt: str, task: TaskSpec) -> str:
        return self.find(task)["answer"]


PROVIDERS = ("template", "openai", "anthropic", "openai-compatible", "recorded")


def make_provider(name: str, model: str | None = None, **options: Any) -> Provider:
    """An LLM provider by name (:data:`PROVIDERS` minus ``"template"``).

    ``options`` go to its constructor (``base_url``, ``timeout``,
    ``max_retries``, ``api_key``; ``answer_id`` for ``recorded``, where
    ``model`` names the answer id).
    """
    if name == "openai":
        return OpenAIProvider(model=model, **options)
    if name == "anthropic":
        return AnthropicProvider(model=model, **options)
    if name == "openai-compatible":
        return OpenAICompatibleProvider(model=model, **options)
    if name == "recorded":
        return RecordedProvider(answer_id=model, **options)
    raise CodegenError(f"unknown provider {name!r}; expected one of "
                       f"{', '.join(PROVIDERS)}")
