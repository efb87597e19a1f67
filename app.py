"""EARS Studio: the Gradio app. UI only: layout, callbacks and streaming.

Decoding, metrics and figures come from ``ears_core`` (``stream``, ``autoregressive_stream``,
``ears_core.viz``); nothing here computes a probability.

    python app.py                      # http://127.0.0.1:7860 on the embedded pair (HOST / PORT override)

Configuration comes from environment variables (``ears_core.settings``: EARS_TARGET, EARS_DRAFT,
EARS_DEVICE, HOST, PORT and the limits of a public server); see the README's table.

Terms
-----
backend     the loaded model pair: target, a draft (a model, or n-gram prompt lookup when the
            embedded draft is not trained yet), tokenizer, vocab size. Loaded once, lazily.
pair_loader a zero-argument function returning a Backend; tests inject a tiny random pair.
picker      the model-pair chooser: the presets of ``ears_core.models.PRESETS`` (the embedded pair
            first) or free text for any target / draft. One pair is in memory at a time.
limits      per request: max new tokens, prompt characters, seconds of decoding (Settings).
samples     throughput samples [(decode_s, tokens_so_far)] recorded while a run streams; decode_s
            counts only time spent decoding, not rendering (see _Timed).
baseline    target-only decoding of the same prompt, temperature, seed and length; cached.
"""

from __future__ import annotations

import csv
import gc
import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from ears_core import autoregressive_stream, rule_from_name, stream, summarize
from ears_core import viz
from ears_core.settings import NGRAM, Settings

EXAMPLES = [
    ["Write a short poem about a lighthouse keeper who befriends a storm."],  # creative writing
    ["Why do leaves change colour in autumn? Answer in a few sentences."],  # open QA
    ["A train travels 120 km in 1.5 hours. What is its average speed? Explain step by step."],  # math
]
RULES = ["EARS", "ordinary", "greedy"]
MAX_NEW_TOKENS = 512  # defaults of the limits; Settings (environment variables) override them
MAX_PROMPT_CHARS = 4000
CUSTOM = "Custom: type a target and a draft below"
LOG = logging.getLogger("ears_studio")
PLOT_EVERY_S = 0.5  # charts are redrawn at most this often while tokens stream
CSS = ".ears-tokens {font-family: ui-sans-serif, system-ui;} #message {color: #b91c1c; font-weight: 600;}"
LAUNCH_KW: dict[str, Any] = dict(theme=gr.themes.Soft(primary_hue="pink"), css=CSS)


@dataclass
class Backend:
    target: Any
    draft_model: Any | None  # a model, a Drafter (copied per run: it is stateful), or None: n-gram
    tokenizer: Any
    vocab_size: int
    name: str
    device: str = "cpu"  # where the models run, for the page: e.g. "cuda:0 NVIDIA H100 (bfloat16)"

    def new_draft(self) -> Any:
        from ears_core.drafters import drafter_for_run
        return drafter_for_run(self.draft_model, self.vocab_size)

    def encode(self, prompt: str) -> Any:
        from ears_core.models import encode_prompt
        return encode_prompt(self.tokenizer, prompt, device=self.target.device)


def resolve_draft(target: str, draft: str | None) -> str | None:
    """The draft spec for ``load_pair``: None (not named) -> the target's default draft
    (``default_draft``), NGRAM -> None (n-gram prompt lookup); the embedded draft only when trained."""
    from ears_core.models import EMBEDDED, default_draft, embedded_draft_available
    draft = default_draft(target) if draft is None else (None if draft == NGRAM else draft)
    if draft == EMBEDDED and not embedded_draft_available():
        return None
    return draft


def load_backend(target: str, draft: str | None, settings: Settings | None = None) -> Backend:
    """Any pair on the configured device: ``target`` / ``draft`` as ``load_pair`` takes them
    (draft None: the default for the target; NGRAM: n-gram prompt lookup)."""
    from ears_core.models import describe_device, load_pair
    settings = settings or Settings()
    spec = resolve_draft(target, draft)
    pair = load_pair(target, spec, device=settings.torch_device, cache_dir=settings.cache,
                     allow_download=settings.allow_download)
    return Backend(pair.target, pair.draft, pair.tokenizer, pair.vocab_size,
                   _public_name(pair.name + ("" if spec is not None else " <- n-gram prompt lookup")),
                   describe_device(pair.target))


def load_embedded() -> Backend:
    """The embedded target, with the trained embedded draft if present, else n-gram lookup
    (the same choice as ``python -m ears_core.generate --draft auto``)."""
    return load_backend("embedded", None)


def check_backend(target: str, draft: str | None, settings: Settings) -> None:
    """Tokenizers only (seconds): a pair that is not cached or does not match fails here."""
    from ears_core.models import check_pair
    check_pair(target, resolve_draft(target, draft), cache_dir=settings.cache, allow_download=settings.allow_download)


class Studio:
    """Holds the one loaded pair (thread-safe, lazy), which pair is chosen, and the cache of
    target-only baselines for that pair.

    pair_loader: a zero-argument loader for the default pair (tests inject a tiny one); other
    pairs come from ``loader(target, draft)`` (default ``load_backend`` on ``settings``).
    """

    def __init__(self, pair_loader: Callable[[], Backend] | None = None, settings: Settings | None = None,
                 loader: Callable[[str, str | None], Backend] | None = None) -> None:
        self.settings = settings or Settings()
        self.default = (self.settings.target, self.settings.draft)
        self.choice = self.default  # (target, draft) of the pair in memory, or to load on first use
        self._default_loader = pair_loader
        self._loader = loader or (lambda t, d: load_backend(t, d, self.settings))
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self.baselines: dict[tuple, tuple[list, float]] = {}  # key -> (samples, tokens/s)

    @staticmethod
    def _same(a: tuple[str, str | None], b: tuple[str, str | None]) -> bool:
        """Whether two (target, draft) choices name the same pair once the default draft is filled in."""
        return a[0] == b[0] and resolve_draft(*a) == resolve_draft(*b)

    def _load(self, choice: tuple[str, str | None]) -> Backend:
        if self._same(choice, self.default) and self._default_loader is not None:
            return self._default_loader()
        return self._loader(*choice)

    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._load(self.choice)
            return self._backend

    @property
    def loaded(self) -> Backend | None:
        return self._backend

    def switch(self, target: str, draft: str | None, check: bool = True,
               progress: Callable[[str], Any] | None = None) -> Backend:
        """Make (target, draft) the pair in memory. The tokenizers are checked first, so a pair that
        is not cached or does not match fails while the current pair stays loaded; then the current
        pair is dropped before the new one loads (one pair in memory). If that load fails, the
        previous choice comes back on the next request."""
        choice = (target, draft)
        with self._lock:
            if self._same(choice, self.choice) and self._backend is not None:
                return self._backend
            if check and not (self._same(choice, self.default) and self._default_loader is not None):
                check_backend(target, draft, self.settings)
            previous, self._backend = self.choice, None
            self.baselines.clear()
            _free_memory()
            if progress is not None:
                progress(f"loading {target}" + ("" if draft is None else f" <- {draft}"))
            try:
                self._backend = self._load(choice)
            except BaseException:
                self.choice = previous
                _free_memory()
                raise
            self.choice = choice
            return self._backend


def _free_memory() -> None:
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class InputError(ValueError):
    """A bad value from the page or the API; shown as a message, never raised to the client."""


def _check(prompt: str, beta: float, temperature: float, k: float, max_new: float, seed: float, *,
           max_new_tokens: int = MAX_NEW_TOKENS, max_prompt_chars: int = MAX_PROMPT_CHARS) -> tuple:
    if not prompt or not str(prompt).strip():
        raise InputError("The prompt is empty: type something or pick an example.")
    if len(str(prompt)) > max_prompt_chars:
        raise InputError(f"The prompt has {len(str(prompt))} characters; this server accepts at most "
                         f"{max_prompt_chars}. Shorten it.")
    checks = [("beta", beta, 0.0, 1.0), ("temperature", temperature, 0.0, 2.0), ("K", k, 1, 8),
              ("max new tokens", max_new, 1, max_new_tokens), ("seed", seed, 0, 2**31 - 1)]
    for name, value, lo, hi in checks:
        if value is None or not (lo <= float(value) <= hi):
            raise InputError(f"{name} must be between {lo} and {hi}, got {value!r}.")
    for name, value in (("K", k), ("max new tokens", max_new), ("seed", seed)):
        if float(value) != int(float(value)):
            raise InputError(f"{name} must be a whole number, got {value!r}.")
    return str(prompt), float(beta), float(temperature), int(k), int(max_new), int(seed)


def _message(text: str) -> str:
    gr.Warning(text)
    return f"⚠️ {text}"


# A file path: two or more /segments not glued to a word or a slash (hub ids "org/name" and URLs survive).
_PATH = re.compile(r"(?<![\w/.~])(?:~|\.{1,2})?(?:/[^\s/'\"`\[\](),;:]+){2,}/?")


def public_error(exc: BaseException) -> str:
    """A short message for the page: the first line of the error with file paths replaced by
    <path> and any trailing [library detail] dropped; never a traceback (that goes to the log)."""
    from ears_core.models import is_out_of_memory
    if is_out_of_memory(exc):
        return ("Out of memory: this pair or request does not fit on this machine. Pick a smaller pair, "
                "or lower max new tokens.")
    text = str(exc).strip().splitlines()[0].strip() if str(exc).strip() else ""
    text = re.sub(r"\s*\[[^\[\]]*\]$", "", text)
    text = _PATH.sub("<path>", text)
    if not text:
        text = f"Something went wrong ({type(exc).__name__}); the server log has the details."
    return text[:400] + ("…" if len(text) > 400 else "")


def _fail(exc: BaseException) -> str:
    """Log exc with its traceback on the server; return the page's message for it."""
    if isinstance(exc, ValueError):  # bad input, a model that cannot load: the message says it all
        LOG.info("request refused: %s", exc)
    else:  # unexpected: the traceback goes to the server log, never to the page
        LOG.warning("request failed", exc_info=exc)
    return _message(public_error(exc))


def _timeout_note(limit_s: float) -> str:
    return (f"Stopped after {limit_s:g} s: this server allows {limit_s:g} s of decoding per request. "
            "Lower max new tokens, or run the app yourself.")


class _Timed:
    """Iterate a Generation, timing only the decoding: the clock runs inside ``next()`` and stops
    while the UI renders, so a run that streams charts is not charged for them and the
    speculative run and the target-only baseline are measured alike.

    samples: [(decode_s, tokens_so_far)] for the throughput chart; stats(): metrics on that clock.
    deadline: a ``time.perf_counter()`` value; once past it (and at least one token out) the
    iteration ends early and ``timed_out`` is set. ``result()`` then gives the tokens so far.
    """

    def __init__(self, gen: Any, deadline: float | None = None) -> None:
        self.gen, self.decode_s, self.samples = gen, 0.0, [(0.0, 0)]
        self.deadline, self.timed_out = deadline, False

    def __iter__(self):
        it = iter(self.gen)
        while True:
            if self.deadline is not None and self.gen.events and time.perf_counter() > self.deadline:
                self.timed_out = True
                return
            t0 = time.perf_counter()
            try:
                ev = next(it)
            except StopIteration:
                return
            finally:
                self.decode_s += time.perf_counter() - t0
            self.samples.append((self.decode_s, len(self.gen.events)))
            yield ev

    def stats(self) -> Any:
        g = self.gen
        return summarize(g.method, g.events, g.steps, self.decode_s, g.gamma)

    def result(self) -> Any:
        """The whole generation, or after a timeout the tokens so far (the decoder is left unfinished)."""
        if not self.timed_out:
            return self.gen.result()
        from ears_core.decoding import GenerationResult
        ev = self.gen.events
        return GenerationResult([e.token_id for e in ev], "".join(e.text for e in ev), ev, self.gen.steps, self.stats())


MAIN_OUT = ("tokens", "message", "summary", "conf", "ratio", "tput", "hist", "details", "state",
            "theory", "theory_k", "theory_c")


def _pack(**kw: Any) -> tuple:
    return tuple(kw.get(name, gr.skip()) for name in MAIN_OUT)


def _limits(studio: Studio) -> dict:
    return dict(max_new_tokens=studio.settings.max_new_tokens, max_prompt_chars=studio.settings.max_prompt_chars)


def make_generate(studio: Studio) -> Callable:
    def generate(prompt, beta, temperature, k, max_new, seed, rule_name, with_baseline):
        """Stream one generation; any failure, even mid-stream, becomes a short message."""
        try:
            yield from _generate(prompt, beta, temperature, k, max_new, seed, rule_name, with_baseline)
        except Exception as exc:
            yield _pack(message=_fail(exc))

    def _generate(prompt, beta, temperature, k, max_new, seed, rule_name, with_baseline):
        """Stream one generation: token HTML per token, charts every PLOT_EVERY_S, then the summary."""
        try:
            prompt, beta, temperature, k, max_new, seed = _check(prompt, beta, temperature, k, max_new, seed,
                                                                 **_limits(studio))
            be = studio.backend()
            rule = rule_from_name("greedy" if rule_name == "greedy" or temperature == 0 else
                                  ("ears" if rule_name == "EARS" else "standard"), beta)
            if rule.name == "greedy":
                temperature = 0.0
            ids = be.encode(prompt)
            kw = dict(temperature=temperature, max_new_tokens=max_new, seed=seed, tokenizer=be.tokenizer,
                      vocab_size=be.vocab_size)
            gen = stream(be.target, be.new_draft(), ids, rule=rule, gamma=k, **kw)
        except Exception as exc:  # bad input, model load failure: show it, keep serving
            yield _pack(message=_fail(exc))
            return
        yield _pack(tokens=viz.tokens_html([], cursor=True), message="", summary="*generating…*")
        deadline = time.perf_counter() + studio.settings.timeout_s  # decoding time: loading is not counted
        last_plot, timed = time.perf_counter(), _Timed(gen, deadline)
        base_key = (prompt, temperature, max_new, seed)
        base = studio.baselines.get(base_key)
        for _ in timed:
            html = viz.tokens_html(gen.events, cursor=True)
            if time.perf_counter() - last_plot < PLOT_EVERY_S:
                yield _pack(tokens=html)
                continue
            last_plot = time.perf_counter()
            yield _pack(tokens=html, conf=viz.confidence_figure(gen.events, beta), ratio=viz.ratio_figure(gen.steps),
                        tput=viz.throughput_figure({"speculative": timed.samples}),
                        hist=viz.accept_length_figure(gen.steps, k))
        res, st = timed.result(), timed.stats()
        note = _message(_timeout_note(studio.settings.timeout_s)) if timed.timed_out else ""
        runs = {rule.describe(): timed.samples}
        yield _pack(tokens=viz.tokens_html(res.events), conf=viz.confidence_figure(res.events, beta),
                    ratio=viz.ratio_figure(res.steps), hist=viz.accept_length_figure(res.steps, k),
                    tput=viz.throughput_figure(runs), summary=viz.summary_markdown(st))
        if with_baseline and base is None and not timed.timed_out:
            btimed = _Timed(autoregressive_stream(be.target, ids, **kw), deadline)
            for _ in btimed:
                if time.perf_counter() - last_plot >= PLOT_EVERY_S:
                    last_plot = time.perf_counter()
                    yield _pack(tput=viz.throughput_figure({**runs, "target-only": btimed.samples}),
                                summary=viz.summary_markdown(st) + "\n\n*measuring target-only…*")
            base = (btimed.samples, btimed.stats().tokens_per_s)
            if btimed.timed_out:  # a partial baseline still measures tokens/s, but is not cached
                note = _message(_timeout_note(studio.settings.timeout_s) + " (during the target-only baseline)")
            else:
                studio.baselines[base_key] = base
        if base is not None:
            runs["target-only"] = base[0]
        base_tps = base[1] if base else None
        speedup = st.tokens_per_s / base_tps if base_tps else None
        c = st.cost_ratio if st.cost_ratio is not None else 0.05
        measured = None if st.acceptance_rate is None else (st.acceptance_rate, st.mean_accept_length, speedup)
        details = {"model": be.name, "device": be.device, "rule": rule.describe(), "text": res.text,
                   "kinds": [e.kind for e in res.events], "stats": st.to_dict(),
                   "baseline_tokens_per_s": base_tps, "speedup": speedup}
        state = {"settings": {"prompt": prompt, "rule": rule.describe(), "beta": beta, "temperature": temperature,
                              "K": k, "max_new_tokens": max_new, "seed": seed, "model": be.name,
                              "device": be.device},
                 "stats": st.to_dict(), "baseline_tokens_per_s": base_tps, "measured": measured,
                 "events": [e.to_dict() for e in res.events], "steps": [s.to_dict() for s in res.steps]}
        yield _pack(tokens=viz.tokens_html(res.events), message=note, tput=viz.throughput_figure(runs),
                    summary=viz.summary_markdown(st, base_tps) + f"\n\n*model: {be.name} on {be.device}*",
                    details=details, state=state, theory=viz.theory_figure(k, c, measured),
                    theory_k=k, theory_c=round(min(c, 1.0), 3))

    return generate


def make_race(studio: Studio) -> Callable:
    def race(prompt, beta, temperature, k, max_new, seed):
        """The race; any failure, even mid-stream, becomes a short message."""
        try:
            yield from _race(prompt, beta, temperature, k, max_new, seed)
        except Exception as exc:
            yield gr.skip(), gr.skip(), gr.skip(), _fail(exc), gr.skip()

    def _race(prompt, beta, temperature, k, max_new, seed):
        """EARS, the ordinary rule and target-only on the same prompt and seed, one after another."""
        empty = viz.tokens_html([])
        try:
            prompt, beta, temperature, k, max_new, seed = _check(prompt, beta, temperature, k, max_new, seed,
                                                                 **_limits(studio))
            be = studio.backend()
            ids = be.encode(prompt)
        except Exception as exc:
            yield empty, empty, empty, _fail(exc), gr.skip()
            return
        kw = dict(temperature=temperature, max_new_tokens=max_new, seed=seed, tokenizer=be.tokenizer,
                  vocab_size=be.vocab_size)
        deadline = time.perf_counter() + studio.settings.timeout_s  # decoding time: loading is not counted
        names = [f"EARS β={beta:g}", "ordinary", "target-only"]
        html, runs, results = [empty] * 3, {}, []
        for i, name in enumerate(names):
            if i < 2:
                gen = stream(be.target, be.new_draft(), ids, rule=rule_from_name("ears" if i == 0 else "standard", beta),
                             gamma=k, **kw)
            else:
                gen = autoregressive_stream(be.target, ids, **kw)
            last, timed = 0.0, _Timed(gen, deadline)
            for _ in timed:
                html[i] = viz.tokens_html(gen.events, cursor=True)
                if time.perf_counter() - last >= 0.1:
                    last = time.perf_counter()
                    yield *html, f"*racing: {name}…*", gr.skip()
            if timed.timed_out:
                html[i] = viz.tokens_html(gen.events)
                yield *html, _message(_timeout_note(studio.settings.timeout_s) + f" (during {name})"), gr.skip()
                return
            gen.result()
            results.append((gen.events, timed.stats()))
            runs[name] = timed.samples
            html[i] = viz.tokens_html(gen.events)
        (ears_ev, _), (ord_ev, _), (_, base) = results
        div = viz.first_divergence(ears_ev, ord_ev)
        html[0] = viz.tokens_html(ears_ev, mark_position=div)
        html[1] = viz.tokens_html(ord_ev, mark_position=div)
        base_tps = base.tokens_per_s
        lines = ["| run | tokens/s | speedup | acceptance | pardons | mean distortion |", "|---|---|---|---|---|---|"]
        for name, (_, s) in zip(names, results):
            lines.append(f"| {name} | {s.tokens_per_s:.1f} | {s.tokens_per_s / base_tps:.2f}× | "
                         f"{'–' if s.acceptance_rate is None else f'{s.acceptance_rate:.2f}'} | {s.pardoned} | "
                         f"{s.mean_distortion:.4f} |")
        if div is None:
            lines.append("\nEARS and the ordinary rule emitted the same tokens (no pardon changed the text).")
        else:
            lines.append(f"\nFirst divergence at position {div} (outlined): EARS emitted a **{ears_ev[div].kind}** "
                         f"token {ears_ev[div].text!r} where the ordinary rule emitted {ord_ev[div].text!r}.")
        yield *html, "\n".join(lines), viz.throughput_figure(runs)

    return race


def export_run(state: dict | None):
    """Write the last run's events as CSV and the whole run as JSON; return both paths."""
    if not state:
        return None, None, _message("Nothing to export yet: generate first.")
    folder = tempfile.mkdtemp(prefix="ears_run_")
    csv_path, json_path = os.path.join(folder, "ears_events.csv"), os.path.join(folder, "ears_run.json")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(state["events"][0].keys()) if state["events"] else ["position"])
        writer.writeheader()
        writer.writerows(state["events"])
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    return csv_path, json_path, ""


def _public_name(name: str) -> str:
    """A model name for the page: a local folder shows as its last part, never a full path."""
    return _PATH.sub(lambda m: os.path.basename(m.group(0).rstrip("/")), name)


def model_status(studio: Studio) -> str:
    """The picker's line: which pair is in memory and on which device, or which loads next."""
    be = studio.loaded
    if be is not None:
        return f"**Loaded:** {_public_name(be.name)} · runs on **{be.device}**"
    target, draft = studio.choice
    pair = target if draft is None else f"{target} <- {draft}"
    where = {"auto": "a CUDA GPU if one is visible, else the CPU"}.get(studio.settings.device, studio.settings.device)
    return f"**Chosen:** {_public_name(pair)} · loads on the first request, on {where}"


def picker_labels(studio: Studio) -> tuple[list[str], str]:
    """(the picker's choices, the one shown first): the presets, the server's configured pair when
    it is not a preset (EARS_TARGET / EARS_DRAFT), and free text when custom models are on."""
    from ears_core.models import PRESETS
    labels = [p.label for p in PRESETS]
    default = next((p.label for p in PRESETS if studio._same((p.target, p.draft), studio.default)), None)
    if default is None:
        target, draft = studio.default
        default = f"Server default: {_public_name(target if draft is None else f'{target} <- {draft}')}"
        labels.insert(0, default)
    return labels + ([CUSTOM] if studio.settings.custom_models else []), default


def _pick(studio: Studio, label: str, target: str | None, draft: str | None) -> tuple[str, str | None]:
    """(target, draft) from the picker: a preset, or the free-text fields when custom models are on.
    An empty draft field means the target's default (the preset's draft, else n-gram lookup)."""
    from ears_core.models import PRESETS
    preset = next((p for p in PRESETS if p.label == label), None)
    own = preset is None and label != CUSTOM and label == picker_labels(studio)[1]  # the server's own pair
    if own and (not studio.settings.custom_models or not (target or "").strip()):
        return studio.default
    if not studio.settings.custom_models:
        if preset is None:
            raise InputError("This server offers the listed pairs only: pick one from the list.")
        return preset.target, preset.draft
    target, draft = (target or "").strip(), (draft or "").strip()
    if not target:
        if preset is None:
            raise InputError("Type a target (a Hugging Face id or a folder), or pick a pair from the list.")
        return preset.target, preset.draft
    if len(target) > 300 or len(draft) > 300:
        raise InputError("A model name is at most 300 characters.")
    return target, (NGRAM if draft.lower() in (NGRAM, "none") else draft or None)


def make_load(studio: Studio) -> Callable:
    def load(label, target, draft, progress=gr.Progress(track_tqdm=True)):
        """Load the picked pair in place of the current one; failures are a message, never a traceback."""
        try:
            target, draft = _pick(studio, label, target, draft)
            progress(0.0, desc="checking the tokenizers")
            studio.switch(target, draft, progress=lambda desc: progress(0.1, desc=desc))
            return model_status(studio), ""
        except Exception as exc:
            return model_status(studio), _fail(exc)

    return load


def build_app(pair_loader: Callable[[], Backend] | None = None, settings: Settings | None = None,
              loader: Callable[[str, str | None], Backend] | None = None) -> gr.Blocks:
    """The Blocks app, queued. ``pair_loader`` (zero arguments) loads the default pair, once, on
    the first request (tests inject a tiny pair); ``loader(target, draft)`` loads a picked pair
    (default ``load_backend``). ``settings`` default: ``Settings.from_env()``."""
    from ears_core.models import PRESETS
    settings = settings or Settings.from_env()
    studio = Studio(pair_loader, settings, loader)
    with gr.Blocks(title="EARS Studio") as demo:
        gr.Markdown("# EARS Studio\nSpeculative decoding with **EARS**: a draft proposes K tokens, the target checks "
                    "them in one pass. EARS *pardons* a draft whose ratio r = p/q falls just short of the uniform U, "
                    "by at most β·(1 − max P_target).")
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", value=EXAMPLES[0][0],
                                    max_length=settings.max_prompt_chars)
                gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: creative writing, open QA, math")
            with gr.Column(scale=1):
                rule = gr.Radio(RULES, value="EARS", label="Acceptance rule", elem_id="rule")
                beta = gr.Slider(0, 1, value=0.1, step=0.01, label="beta (EARS tolerance)", elem_id="beta")
                temperature = gr.Slider(0, 2, value=0.9, step=0.05, label="temperature (0 = greedy)", elem_id="temperature")
                k = gr.Slider(1, 8, value=4, step=1, label="K (drafts per round)", elem_id="k")
                with gr.Row():
                    max_new = gr.Number(64, label="max new tokens", precision=0, minimum=1, maximum=settings.max_new_tokens,
                                        elem_id="max_new")
                    seed = gr.Number(0, label="seed", precision=0, minimum=0, elem_id="seed")
                with_base = gr.Checkbox(True, label="measure target-only baseline (cached per prompt)")
        with gr.Accordion("Model pair", open=False, elem_id="picker"):
            labels, default = picker_labels(studio)
            with gr.Row():
                pick = gr.Dropdown(labels, value=default, label="Pair (target <- draft, one shared tokenizer)",
                                   elem_id="pick", scale=3)
                load_btn = gr.Button("Load", elem_id="load", scale=1)
            with gr.Row(visible=settings.custom_models):
                own = not any(p.label == default for p in PRESETS)  # a configured pair may be a folder
                pick_target = gr.Textbox("" if own else studio.default[0], label="target: Hugging Face id or folder",
                                         max_length=300, elem_id="pick_target")
                pick_draft = gr.Textbox("" if own else studio.default[1] or "", label="draft: id or folder (empty: the default; "
                                        "'ngram': prompt lookup)", max_length=300, elem_id="pick_draft")
            gr.Markdown("The embedded pair runs anywhere, offline. The others come from the Hugging Face hub and "
                        "need a GPU for the 7B / 8B targets; one pair is in memory at a time.")
            pair_status = gr.Markdown(model_status(studio), elem_id="pair_status")
            pair_message = gr.Markdown("", elem_id="pair_message")

            def fill(label):
                p = next((p for p in PRESETS if p.label == label), None)
                if p is not None:
                    return p.target, p.draft
                if label == default and label != CUSTOM:  # the server's own pair: no path in the page
                    return "", ""
                return gr.skip(), gr.skip()

            pick.change(fill, pick, [pick_target, pick_draft], api_name=False)
            load_btn.click(make_load(studio), [pick, pick_target, pick_draft], [pair_status, pair_message],
                           api_name="load", concurrency_limit=1)
            demo.load(lambda: model_status(studio), None, pair_status, api_name=False)
        inputs = [prompt, beta, temperature, k, max_new, seed]
        with gr.Tabs():
            with gr.Tab("Generate"):
                with gr.Row():
                    go_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                message = gr.Markdown("", elem_id="message")
                gr.HTML(viz.legend_html())
                tokens = gr.HTML(viz.tokens_html([]), elem_id="tokens")
                with gr.Row():
                    conf = gr.Plot(label="max P and tolerance", elem_id="conf_plot")
                    ratio = gr.Plot(label="ratio vs U", elem_id="ratio_plot")
                with gr.Row():
                    tput = gr.Plot(label="throughput", elem_id="tput_plot")
                    hist = gr.Plot(label="accepted per round", elem_id="hist_plot")
                summary = gr.Markdown("", elem_id="summary")
                with gr.Accordion("Export and raw metrics", open=False):
                    export_btn = gr.Button("Export events (CSV + JSON)", elem_id="export")
                    with gr.Row():
                        csv_file, json_file = gr.File(label="CSV"), gr.File(label="JSON")
                    details = gr.JSON(label="metrics of the last run", elem_id="details")
            with gr.Tab("Race"):
                gr.Markdown("EARS, the ordinary rule and target-only decoding on the same prompt and seed, with the "
                            "same random draws: the first token where EARS and the ordinary rule differ is a pardon.")
                with gr.Row():
                    race_btn = gr.Button("Race", variant="primary", elem_id="race")
                    race_stop = gr.Button("Stop", variant="stop")
                with gr.Row():
                    race_html = [gr.HTML(viz.tokens_html([]), label=n, elem_id=f"race_{i}")
                                 for i, n in enumerate(("EARS", "ordinary", "target-only"))]
                race_md = gr.Markdown("", elem_id="race_summary")
                race_plot = gr.Plot(label="throughput")
            with gr.Tab("Why it speeds up"):
                gr.Markdown("One round costs K draft steps and one target pass and emits E = (1 − a^(K+1))/(1 − a) "
                            "tokens on average at acceptance rate a, so the speedup is S = E/(Kc + 1), c = draft "
                            "step / target pass. EARS raises a; the star is the last run.")
                with gr.Row():
                    theory_k = gr.Slider(1, 8, value=4, step=1, label="K")
                    theory_c = gr.Slider(0, 1, value=0.05, step=0.005, label="cost ratio c")
                theory = gr.Plot(viz.theory_figure(4, 0.05), label="theory", elem_id="theory_plot")
            from tpp_tab import build_tpp_tab  # the "Point processes" tab (seed 001): tpp_tab.py
            build_tpp_tab()
        state = gr.State(None)
        outs = dict(tokens=tokens, message=message, summary=summary, conf=conf, ratio=ratio, tput=tput, hist=hist,
                    details=details, state=state, theory=theory, theory_k=theory_k, theory_c=theory_c)
        gen_event = go_btn.click(make_generate(studio), [*inputs, rule, with_base], [outs[n] for n in MAIN_OUT],
                                 api_name="generate")
        stop_btn.click(None, cancels=[gen_event])
        race_event = race_btn.click(make_race(studio), inputs, [*race_html, race_md, race_plot], api_name="race")
        race_stop.click(None, cancels=[race_event])
        export_btn.click(export_run, state, [csv_file, json_file, message], api_name="export")

        def redraw(kk, c, st):
            return viz.theory_figure(int(kk), float(c), (st or {}).get("measured"))

        gr.on([theory_k.change, theory_c.change], redraw, [theory_k, theory_c, state], theory, api_name=False)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=settings.concurrency)
    demo.ears_studio = studio  # so a launcher can preload the models
    return demo


def main() -> None:
    """``python app.py``: settings from the environment, the default pair loading in the background."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    app = build_app(settings=settings)
    threading.Thread(target=app.ears_studio.backend, daemon=True).start()  # load while the page opens
    app.launch(server_name=settings.host, server_port=settings.port, show_error=False, **LAUNCH_KW)


if __name__ == "__main__":
    main()
