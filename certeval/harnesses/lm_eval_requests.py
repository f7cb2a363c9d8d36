"""lm-eval's request-building flags on a ``--tasks`` bank: ``--apply_chat_template [NAME]``,
``--system_instruction TEXT``, ``--fewshot_as_multiturn [BOOL]`` and ``--gen_kwargs K=V,...``, with lm-eval 0.4.13's
meaning.

lm-eval's ``simple_evaluate`` sets a ``generate_until`` task's ``generation_kwargs`` from ``--gen_kwargs``
(``set_config(..., update=True)``) and hands the other three to ``Task.build_all_requests``, which renders each
doc's few-shot context with the model's ``apply_chat_template`` (``HFLM.apply_chat_template``: the tokenizer's
template, ``add_generation_prompt`` for a fresh turn, ``continue_final_message`` after a ``gen_prefix``; a template
that refuses a system turn is tried again without it). certeval builds its bank in the planning process, before any
model host exists, so the same rendering is done here with the model's tokenizer alone (cheap: no weights); the
flags travel in the bank's location (``?apply_chat_template=…&tokenizer=<model folder>&…``), so a resumed run
with other flags is another bank. Every model of the run must render with the same template: the bank is one set
of requests.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certeval.errors import InputError

TRUE_WORDS = ("true", "1", "yes")  # lm-eval's --fewshot_as_multiturn parser: anything else is false
# generation settings certeval's hosts honour as lm-eval's hf model does (greedy); top_p / top_k change nothing
# in a greedy search, anything else (repetition_penalty, num_beams, ...) would change the answer
GEN_KWARGS = ("until", "max_gen_toks", "max_new_tokens", "do_sample", "temperature", "top_p", "top_k")


@dataclass(frozen=True)
class RequestOptions:
    """How lm-eval builds a task's requests beyond the task itself (its ``build_all_requests`` arguments and
    ``--gen_kwargs``)."""

    chat_template: str | None = None  # None: no chat template; "true": the tokenizer's; else a template name
    tokenizer: str | None = None  # the model folder whose tokenizer renders the chat template
    system_instruction: str | None = None
    fewshot_as_multiturn: bool = False
    gen_kwargs: str | None = None  # JSON object over every generate_until task's generation_kwargs

    def query(self) -> dict[str, str]:
        """The bank location's query entries (none for lm-eval's defaults)."""
        out = {}
        if self.chat_template is not None:
            out["apply_chat_template"] = self.chat_template
            out["tokenizer"] = str(self.tokenizer)
        if self.system_instruction is not None:
            out["system_instruction"] = self.system_instruction
        if self.fewshot_as_multiturn:
            out["fewshot_as_multiturn"] = "true"
        if self.gen_kwargs is not None:
            out["gen_kwargs"] = self.gen_kwargs
        return out

    @classmethod
    def from_query(cls, params: dict[str, str]) -> RequestOptions:
        return cls(chat_template=params.get("apply_chat_template"), tokenizer=params.get("tokenizer"),
                   system_instruction=params.get("system_instruction"),
                   fewshot_as_multiturn=params.get("fewshot_as_multiturn") == "true",
                   gen_kwargs=params.get("gen_kwargs"))

    def results_record(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What lm-eval 0.4.13's results file records of these flags, as its command line records them: the
        top-level fields of its ``GeneralConfigTracker`` (``system_instruction`` and ``chat_template`` with their
        sha256 as ``*_sha``; ``fewshot_as_multiturn``, null without a chat template) and ``config.gen_kwargs``
        (the parsed settings, ``{}`` when none were given)."""
        import hashlib

        def sha(text: str | None) -> str | None:
            return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None

        template = None if self.chat_template is None else _template_text(str(self.tokenizer), self.chat_template)
        top = {"system_instruction": self.system_instruction, "system_instruction_sha": sha(self.system_instruction),
               "fewshot_as_multiturn": None if self.chat_template is None else self.fewshot_as_multiturn,
               "chat_template": template, "chat_template_sha": sha(template)}
        return top, {"gen_kwargs": json.loads(self.gen_kwargs) if self.gen_kwargs is not None else {}}

    def configure(self, task) -> None:
        """``--gen_kwargs`` over a ``generate_until`` task's own settings, as ``simple_evaluate`` sets them."""
        if self.gen_kwargs is not None and task.get_config("output_type") == "generate_until":
            task.set_config(key="generation_kwargs", value=json.loads(self.gen_kwargs), update=True)

    def build_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``simple_evaluate`` gives ``Task.build_all_requests`` for these flags."""
        if self.chat_template is None:
            return {"system_instruction": self.system_instruction}
        template = ChatTemplate(str(self.tokenizer), self.chat_template)
        return {"system_instruction": self.system_instruction, "apply_chat_template": True,
                "fewshot_as_multiturn": self.fewshot_as_multiturn, "chat_template": template,
                "tokenizer_name": template.tokenizer_name}


def _tokenizer(folder: str):
    import os

    if not any((Path(folder) / name).is_file() for name in ("tokenizer_config.json", "chat_template.jinja",
                                                            "chat_template.json")):
        raise InputError(f"--apply_chat_template: {folder!r} holds no tokenizer configuration, so no chat template "
                         "(tokenizer_config.json or chat_template.jinja)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # a folder without a readable tokenizer: one line
        raise InputError(f"--apply_chat_template: the tokenizer of {folder!r} could not be read "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


class ChatTemplate:
    """A model's chat template as lm-eval's hf model applies it (``HFLM.apply_chat_template``), with the template
    chosen as lm-eval's ``TemplateLM.chat_template`` chooses it: a tokenizer holding several named templates needs
    ``NAME`` (or one named ``default``); one holding a single template uses it whatever the name."""

    def __init__(self, folder: str, name: str = "true") -> None:
        self.tokenizer = _tokenizer(folder)
        self.tokenizer_name = str(self.tokenizer.name_or_path).replace("/", "__")
        self.text = template_text(self.tokenizer, folder, name)

    def __call__(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        import jinja2

        def render(history):
            return self.tokenizer.apply_chat_template(history, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      continue_final_message=not add_generation_prompt)

        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:  # lm-eval's fallback: a template that takes no system turn
            return render([m for m in chat_history if m["role"] != "system"])


@functools.lru_cache(maxsize=8)
def _template_text(folder: str, name: str) -> str:
    """The text of the template a bank's requests were rendered with (read once per process: results.json is
    written at every look)."""
    return template_text(_tokenizer(folder), folder, name)


def template_text(tokenizer, folder: str, name: str) -> str:
    """The template lm-eval would pick (see :class:`ChatTemplate`); InputError when there is none."""
    templates = getattr(tokenizer, "chat_template", None)
    if isinstance(templates, dict):
        wanted = "default" if name == "true" else name
        if wanted not in templates:
            raise InputError(f"--apply_chat_template {name if name != 'true' else ''}: the tokenizer of {folder!r} "
                             f"holds the templates {', '.join(sorted(templates))}"
                             + ("; name one" if name == "true" else f", not {name!r}"))
        return str(templates[wanted])
    if not templates:
        raise InputError(f"--apply_chat_template: the tokenizer of {folder!r} has no chat template (a base model? "
                         "lm-eval would fail on it too)")
    return str(templates)


def chat_tokenizer(models: list[str], name: str, cache_dir: str | None) -> str:
    """The folder whose tokenizer renders the bank's requests: every model's (hf and vllm models have one) must
    hold the same template, since one bank serves them all."""
    from certeval.inputs.model_spec import parse_model_spec
    from certeval.inputs.smollm import resolve_model_dir

    folders: list[str] = []
    texts: dict[str, str] = {}  # folder -> its template
    for text in models:
        spec = parse_model_spec(text)
        if spec.kind not in ("hf", "vllm"):
            raise InputError(f"--apply_chat_template renders each request with the model's own chat template, read "
                             f"from its tokenizer; --model {text!r} ({spec.kind}) has none certeval can read")
        folder = str(Path(resolve_model_dir(spec.location, cache_dir)).resolve())
        if folder not in texts:
            texts[folder] = ChatTemplate(folder, name).text
        if texts[folder] != texts.get(folders[0] if folders else folder):
            raise InputError(f"--apply_chat_template: --model {text!r} and --model {models[0]!r} have different chat "
                             "templates, and a bank is one set of requests: run them separately")
        folders.append(folder)
    return folders[0]


def parse_gen_kwargs(values: list[str] | None) -> str | None:
    """``--gen_kwargs`` as lm-eval's command line reads it (a JSON object, or ``key=value`` parts split at
    top-level commas, values read as Python literals), kept as JSON; InputError for what certeval's greedy hosts
    would not generate as lm-eval's hf model does."""
    if not values:
        return None
    from lm_eval._cli.utils import key_val_to_dict, try_parse_json

    given = " ".join(values)
    merged: dict[str, Any] = {}
    try:
        first = try_parse_json(values[0])
        if isinstance(first, dict):
            merged.update(first)
        else:
            for value in values:
                merged.update(key_val_to_dict(value))
    except ValueError as exc:
        raise InputError(f"--gen_kwargs {given!r}: {exc}") from None
    other = [k for k in merged if k not in GEN_KWARGS]
    if other:
        raise InputError(f"--gen_kwargs {given!r}: {other[0]!r} is not a setting certeval's hosts honour (they "
                         f"generate greedily with {', '.join(GEN_KWARGS)}); it would not generate as lm-eval did")
    if merged.get("do_sample") or float(merged.get("temperature") or 0.0) > 0.0:
        raise InputError(f"--gen_kwargs {given!r} samples (do_sample / temperature > 0); certeval generates greedily "
                         "and would not score it as lm-eval did")
    try:
        return json.dumps(merged, sort_keys=True)
    except (TypeError, ValueError):
        raise InputError(f"--gen_kwargs {given!r} holds a value that is not plain data") from None


def request_options(args, models: list[str], cache_dir: str | None) -> RequestOptions:
    """The flags of a pipeline command as :class:`RequestOptions`; InputError, naming the flag, for a flag given
    without ``--tasks`` or without the chat template it shapes (as lm-eval refuses ``--fewshot_as_multiturn``)."""
    chat = getattr(args, "apply_chat_template", None)
    system = getattr(args, "system_instruction", None)
    multiturn = getattr(args, "fewshot_as_multiturn", None)
    gen_kwargs = parse_gen_kwargs(getattr(args, "gen_kwargs", None))
    given = {"--apply_chat_template": chat, "--system_instruction": system, "--fewshot_as_multiturn": multiturn,
             "--gen_kwargs": gen_kwargs}
    if args.bank is None:
        flag, value = next(((f, v) for f, v in given.items() if v is not None), (None, None))
        if flag is not None:
            raise InputError(f"{flag} {value!r} shapes the requests of lm-eval tasks: it needs --tasks (a task YAML or "
                             "task names)")
        return RequestOptions()
    if multiturn is True and chat is None:
        raise InputError("--fewshot_as_multiturn true puts the few-shot examples in chat turns: it needs "
                         "--apply_chat_template (as in lm-eval)")
    if chat is None:
        return RequestOptions(system_instruction=system, gen_kwargs=gen_kwargs)
    name = "true" if chat is True else str(chat)
    return RequestOptions(chat_template=name, tokenizer=chat_tokenizer(models, name, cache_dir),
                          system_instruction=system, fewshot_as_multiturn=multiturn is not False,
                          gen_kwargs=gen_kwargs)


def parse_bool(text: str) -> bool:
    """lm-eval's ``--fewshot_as_multiturn`` value: true / 1 / yes (any case) is true, anything else false."""
    return text.lower() in TRUE_WORDS


def fraction_budget(frame, fraction: float) -> int:
    """lm-eval's fractional ``--limit`` as an item budget: as many items as lm-eval would score,
    ``ceil(n_t × fraction)`` of each task ``t`` of ``n_t`` docs (``evaluator_utils.get_sample_size``), summed. certeval
    draws them by its method across every task, so its interval is still the whole task's."""
    import math

    counts = frame["subset"].value_counts().tolist() if "subset" in frame.columns else [len(frame)]
    return sum(int(math.ceil(n * fraction)) for n in counts)
