"""EARS Studio: the Gradio app. UI only: layout, callbacks and streaming.

Decoding, metrics and figures come from ``ears_core`` (``stream``, ``autoregressive_stream``,
``ears_core.viz``); nothing here computes a probability.

    python app.py                      # http://127.0.0.1:7860 on the embedded pair (HOST / PORT override)

Terms
-----
backend     the loaded model pair: target, a draft (a model, or n-gram prompt lookup when the
            embedded draft is not trained yet), tokenizer, vocab size. Loaded once, lazily.
pair_loader a zero-argument function returning a Backend; tests inject a tiny random pair.
samples     throughput samples [(decode_s, tokens_so_far)] recorded while a run streams; decode_s
            counts only time spent decoding, not rendering (see _Timed).
baseline    target-only decoding of the same prompt, temperature, seed and length; cached.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from ears_core import autoregressive_stream, rule_from_name, stream, summarize
from ears_core import viz

EXAMPLES = [
    ["Write a short poem about a lighthouse keeper who befriends a storm."],  # creative writing
    ["Why do leaves change colour in autumn? Answer in a few sentences."],  # open QA
    ["A train travels 120 km in 1.5 hours. What is its average speed? Explain step by step."],  # math
]
RULES = ["EARS", "ordinary", "greedy"]
MAX_NEW_TOKENS = 512
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

    def new_draft(self) -> Any:
        from ears_core.drafters import NGramDrafter
        if self.draft_model is None:
            return NGramDrafter(self.vocab_size)
        fresh = getattr(self.draft_model, "fresh", None)  # a stateful Drafter: one per run
        return fresh() if fresh is not None else self.draft_model

    def encode(self, prompt: str) -> Any:
        from ears_core.models import encode_prompt
        return encode_prompt(self.tokenizer, prompt, device=self.target.device)


def load_embedded() -> Backend:
    """The embedded target, with the trained embedded draft if present, else n-gram lookup
    (the same choice as ``python -m ears_core.generate --draft auto``)."""
    from ears_core.models import embedded_draft_available, load_pair
    trained = embedded_draft_available()
    pair = load_pair("embedded", "embedded" if trained else None)
    return Backend(pair.target, pair.draft, pair.tokenizer, pair.vocab_size,
                   f"{pair.name}" + ("" if trained else " <- n-gram prompt lookup"))


class Studio:
    """Holds the backend (loaded once, thread-safe) and the cache of target-only baselines."""

    def __init__(self, pair_loader: Callable[[], Backend]) -> None:
        self._loader, self._backend, self._lock = pair_loader, None, threading.Lock()
        self.baselines: dict[tuple, tuple[list, float]] = {}  # key -> (samples, tokens/s)

    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._loader()
            return self._backend


class InputError(ValueError):
    """A bad value from the page or the API; shown as a message, never raised to the client."""


def _check(prompt: str, beta: float, temperature: float, k: float, max_new: float, seed: float) -> tuple:
    if not prompt or not str(prompt).strip():
        raise InputError("The prompt is empty: type something or pick an example.")
    checks = [("beta", beta, 0.0, 1.0), ("temperature", temperature, 0.0, 2.0), ("K", k, 1, 8),
              ("max new tokens", max_new, 1, MAX_NEW_TOKENS), ("seed", seed, 0, 2**31 - 1)]
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


class _Timed:
    """Iterate a Generation, timing only the decoding: the clock runs inside ``next()`` and stops
    while the UI renders, so a run that streams charts is not charged for them and the
    speculative run and the target-only baseline are measured alike.

    samples: [(decode_s, tokens_so_far)] for the throughput chart; stats(): metrics on that clock.
    """

    def __init__(self, gen: Any) -> None:
        self.gen, self.decode_s, self.samples = gen, 0.0, [(0.0, 0)]

    def __iter__(self):
        it = iter(self.gen)
        while True:
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


MAIN_OUT = ("tokens", "message", "summary", "conf", "ratio", "tput", "hist", "details", "state",
            "theory", "theory_k", "theory_c")


def _pack(**kw: Any) -> tuple:
    return tuple(kw.get(name, gr.skip()) for name in MAIN_OUT)


def make_generate(studio: Studio) -> Callable:
    def generate(prompt, beta, temperature, k, max_new, seed, rule_name, with_baseline):
        """Stream one generation: token HTML per token, charts every PLOT_EVERY_S, then the summary."""
        try:
            prompt, beta, temperature, k, max_new, seed = _check(prompt, beta, temperature, k, max_new, seed)
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
            yield _pack(message=_message(str(exc)))
            return
        yield _pack(tokens=viz.tokens_html([], cursor=True), message="", summary="*generating…*")
        last_plot, timed = time.perf_counter(), _Timed(gen)
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
        res, st = gen.result(), timed.stats()
        runs = {rule.describe(): timed.samples}
        yield _pack(tokens=viz.tokens_html(res.events), conf=viz.confidence_figure(res.events, beta),
                    ratio=viz.ratio_figure(res.steps), hist=viz.accept_length_figure(res.steps, k),
                    tput=viz.throughput_figure(runs), summary=viz.summary_markdown(st))
        if with_baseline and base is None:
            btimed = _Timed(autoregressive_stream(be.target, ids, **kw))
            for _ in btimed:
                if time.perf_counter() - last_plot >= PLOT_EVERY_S:
                    last_plot = time.perf_counter()
                    yield _pack(tput=viz.throughput_figure({**runs, "target-only": btimed.samples}),
                                summary=viz.summary_markdown(st) + "\n\n*measuring target-only…*")
            base = studio.baselines[base_key] = (btimed.samples, btimed.stats().tokens_per_s)
        if base is not None:
            runs["target-only"] = base[0]
        base_tps = base[1] if base else None
        speedup = st.tokens_per_s / base_tps if base_tps else None
        c = st.cost_ratio if st.cost_ratio is not None else 0.05
        measured = None if st.acceptance_rate is None else (st.acceptance_rate, st.mean_accept_length, speedup)
        details = {"model": be.name, "rule": rule.describe(), "text": res.text,
                   "kinds": [e.kind for e in res.events], "stats": st.to_dict(),
                   "baseline_tokens_per_s": base_tps, "speedup": speedup}
        state = {"settings": {"prompt": prompt, "rule": rule.describe(), "beta": beta, "temperature": temperature,
                              "K": k, "max_new_tokens": max_new, "seed": seed, "model": be.name},
                 "stats": st.to_dict(), "baseline_tokens_per_s": base_tps, "measured": measured,
                 "events": [e.to_dict() for e in res.events], "steps": [s.to_dict() for s in res.steps]}
        yield _pack(tokens=viz.tokens_html(res.events), message="", tput=viz.throughput_figure(runs),
                    summary=viz.summary_markdown(st, base_tps) + f"\n\n*model: {be.name}*",
                    details=details, state=state, theory=viz.theory_figure(k, c, measured),
                    theory_k=k, theory_c=round(min(c, 1.0), 3))

    return generate


def make_race(studio: Studio) -> Callable:
    def race(prompt, beta, temperature, k, max_new, seed):
        """EARS, the ordinary rule and target-only on the same prompt and seed, one after another."""
        empty = viz.tokens_html([])
        try:
            prompt, beta, temperature, k, max_new, seed = _check(prompt, beta, temperature, k, max_new, seed)
            be = studio.backend()
            ids = be.encode(prompt)
        except Exception as exc:
            yield empty, empty, empty, _message(str(exc)), gr.skip()
            return
        kw = dict(temperature=temperature, max_new_tokens=max_new, seed=seed, tokenizer=be.tokenizer,
                  vocab_size=be.vocab_size)
        names = [f"EARS β={beta:g}", "ordinary", "target-only"]
        html, runs, results = [empty] * 3, {}, []
        for i, name in enumerate(names):
            if i < 2:
                gen = stream(be.target, be.new_draft(), ids, rule=rule_from_name("ears" if i == 0 else "standard", beta),
                             gamma=k, **kw)
            else:
                gen = autoregressive_stream(be.target, ids, **kw)
            last, timed = 0.0, _Timed(gen)
            for _ in timed:
                html[i] = viz.tokens_html(gen.events, cursor=True)
                if time.perf_counter() - last >= 0.1:
                    last = time.perf_counter()
                    yield *html, f"*racing: {name}…*", gr.skip()
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


def build_app(pair_loader: Callable[[], Backend] = load_embedded) -> gr.Blocks:
    """The Blocks app, queued. ``pair_loader`` is called once, on the first request."""
    studio = Studio(pair_loader)
    with gr.Blocks(title="EARS Studio") as demo:
        gr.Markdown("# EARS Studio\nSpeculative decoding with **EARS**: a draft proposes K tokens, the target checks "
                    "them in one pass. EARS *pardons* a draft whose ratio r = p/q falls just short of the uniform U, "
                    "by at most β·(1 − max P_target).")
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", value=EXAMPLES[0][0])
                gr.Examples(EXAMPLES, inputs=[prompt], label="Examples: creative writing, open QA, math")
            with gr.Column(scale=1):
                rule = gr.Radio(RULES, value="EARS", label="Acceptance rule", elem_id="rule")
                beta = gr.Slider(0, 1, value=0.1, step=0.01, label="beta (EARS tolerance)", elem_id="beta")
                temperature = gr.Slider(0, 2, value=0.9, step=0.05, label="temperature (0 = greedy)", elem_id="temperature")
                k = gr.Slider(1, 8, value=4, step=1, label="K (drafts per round)", elem_id="k")
                with gr.Row():
                    max_new = gr.Number(64, label="max new tokens", precision=0, minimum=1, maximum=MAX_NEW_TOKENS,
                                        elem_id="max_new")
                    seed = gr.Number(0, label="seed", precision=0, minimum=0, elem_id="seed")
                with_base = gr.Checkbox(True, label="measure target-only baseline (cached per prompt)")
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
    demo.queue(max_size=16, default_concurrency_limit=2)
    demo.ears_studio = studio  # so a launcher can preload the models
    return demo


if __name__ == "__main__":
    app = build_app()
    threading.Thread(target=app.ears_studio.backend, daemon=True).start()  # load while the page opens
    app.launch(server_name=os.environ.get("HOST", "127.0.0.1"), server_port=int(os.environ.get("PORT", "7860")),
               **LAUNCH_KW)
