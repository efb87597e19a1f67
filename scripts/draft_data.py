"""Data for the embedded draft at scale (issue 15), resumable: run it for any number of minutes,
stop it at any moment, run it again later; finished work is never lost or redone.

Stages (subcommands):

  prompts    write / extend the prompt manifest assets/draft_data/prompts.jsonl: one JSON object a
             line, {"id", "prompt", "task", "source"}. Append-only, so prompt ids never change; built
             from scripts/draft_prompts.py (plus what ``questions`` adds). ``sample`` syncs it.
  questions  questions written by the target itself at a high temperature, filtered (one line,
             ends with "?", 4-30 words, new, not a held-out prompt) and appended to the manifest.
  sample     the target's own answers, in batches, with transformers' batched ``generate``:
             rounds of one answer per prompt (breadth first, so a short run still covers every
             prompt), round 0 greedy for a quarter of the prompts, every other answer sampled at
             T = 0.9. Each finished batch is written atomically as one compact shard of token ids,
             assets/draft_data/answers/shard-NNNNN.npz (committed: a few MB, never hidden states).
             What is done is read back from the shards, so a rerun continues where the last stopped.
  features   the teacher-forced pass: one forward over prompt + answer with the target's hidden
             states, written per answer shard to $EARS_CACHE/draft_features/<layers>/ (outside the
             repo; float16 .npy readable with mmap). Resumable the same way. scripts/train_draft.py
             --features reads it. ``--target lean`` runs the lean int4 target (LeanLlama, the default
             target on a CPU with native bfloat16) instead of the float one, one answer at a time
             (it takes batch 1, no padding), into <layers>-lean/; ``--shards START:STOP[:STEP]``
             takes a slice of the answer shards.
  status     what the store holds.

Sharing the machine (2 cores, others time benchmarks on it): every stage lowers its own priority
to nice 19, uses --threads torch threads (default 1), and pauses while the file /tmp/ears_quiet
exists (checked between batches and at every generation step, polled every 5 s). --minutes is a
wall-clock budget: no batch starts that would not fit by the last batch's time. SIGTERM / SIGINT
stop at once; the unfinished batch is dropped, every finished one is kept.

    python scripts/draft_data.py sample --minutes 600 [--batch 64] [--max-new-tokens 192] [--answers 6]
    python scripts/draft_data.py questions --count 1500 --minutes 15
    python scripts/draft_data.py features [--layers last] [--minutes 60]
    python scripts/draft_data.py features --target lean --layers 3,15,last --shards 0:95:4
    python scripts/draft_data.py status
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import random
import re
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_prompts import assert_no_held_out, held_out_prompts, near_held_out  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "assets" / "draft_data"
QUIET_FILE = Path("/tmp/ears_quiet")
FORMAT = 1


# ============================================================================ pacing and stopping
class Pacer:
    """Stop flag (SIGTERM / SIGINT), wall-clock budget and the quiet-file pause, in one place."""

    def __init__(self, minutes: float = float("inf"), quiet_file: Path = QUIET_FILE, poll_s: float = 5.0,
                 log: Callable[[str], None] = print) -> None:
        self.t0 = time.monotonic()
        self.budget_s = minutes * 60
        self.quiet_file = Path(quiet_file)
        self.poll_s = poll_s
        self.stop = False
        self.paused_s = 0.0
        self.log = log

    def install_signals(self) -> None:
        def handler(signum, frame):  # noqa: ARG001
            if self.stop:  # a second signal: leave now
                raise KeyboardInterrupt
            self.stop = True
            self.log(f"signal {signum}: stopping; the unfinished batch is dropped, finished shards are kept")
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def wait_if_quiet(self) -> None:
        """Sleep while the quiet file exists (others are timing something on this machine)."""
        if not self.quiet_file.exists():
            return
        t = time.monotonic()
        self.log(f"{self.quiet_file} exists: pausing (polling every {self.poll_s:g} s)")
        while self.quiet_file.exists() and not self.stop:
            time.sleep(self.poll_s)
        self.paused_s += time.monotonic() - t
        self.log(f"resumed after {time.monotonic() - t:.0f} s")

    def may_start(self, last_batch_s: float | None) -> bool:
        """Whether a new batch may start: not stopped, and it fits the budget by the last batch's time."""
        self.wait_if_quiet()
        if self.stop:
            return False
        return self.elapsed() + (last_batch_s or 0.0) <= self.budget_s


def nice_and_threads(nice: int, threads: int) -> None:
    cur = os.nice(0)
    if nice > cur:
        os.nice(nice - cur)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass


class _SingleInstance:
    """An exclusive lock so two samplers never write the same store (they would redo each other's jobs)."""

    def __init__(self, store: Path, what: str) -> None:
        key = hashlib.sha1(str(store.resolve()).encode()).hexdigest()[:10]
        self.path = Path(f"/tmp/ears_draft_data-{what}-{key}.lock")
        self.fh = None

    def __enter__(self):
        self.fh = open(self.path, "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"another `{self.path.stem}` job already writes this store (lock {self.path}); not starting")
        self.fh.write(str(os.getpid()))
        self.fh.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


# ============================================================================ the prompt manifest
def manifest_path(store: Path) -> Path:
    return store / "prompts.jsonl"


def load_manifest(store: Path) -> list[dict[str, Any]]:
    path = manifest_path(store)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if [r["id"] for r in rows] != list(range(len(rows))):
        raise ValueError(f"{path}: prompt ids must be 0..n-1 in order (the file is append-only)")
    return rows


def append_manifest(store: Path, new: Iterable[dict[str, str]], held: list[str] | None = None) -> list[dict[str, Any]]:
    """Append prompts not yet in the manifest (ids continue); check the whole manifest against the
    held-out set first and refuse to write anything if one leaks. Returns the full manifest."""
    rows = load_manifest(store)
    known = {r["prompt"] for r in rows}
    add = []
    for p in new:
        if p["prompt"] not in known:
            known.add(p["prompt"])
            add.append({"id": len(rows) + len(add), "prompt": p["prompt"], "task": p.get("task", ""),
                        "source": p.get("source", "template")})
    assert_no_held_out([r["prompt"] for r in rows + add], held)
    if add:
        store.mkdir(parents=True, exist_ok=True)
        path = manifest_path(store)
        text = (path.read_text() if path.exists() else "") + "".join(json.dumps(r) + "\n" for r in add)
        _atomic_write_bytes(path, text.encode())
    return rows + add


def sync_manifest(store: Path, held: list[str] | None = None) -> list[dict[str, Any]]:
    from draft_prompts import wide_prompts

    return append_manifest(store, wide_prompts(), held)


# ============================================================================ shards of answers
def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def prompt_crc(ids: list[int]) -> int:
    return zlib.crc32(np.asarray(ids, dtype=np.int32).tobytes())


@dataclass
class Answer:
    prompt_id: int
    round: int
    prompt_len: int
    prompt_crc: int
    tokens: list[int]  # the answer, through the end-of-sequence token when it ended
    ended: bool  # ended with end-of-sequence (else cut at max_new_tokens)


@dataclass
class Shard:
    answers: list[Answer]
    temperature: float
    seed: int
    max_new_tokens: int
    meta: dict[str, Any] = field(default_factory=dict)


def answers_dir(store: Path) -> Path:
    return store / "answers"


def write_shard(folder: Path, index: int, shard: Shard) -> Path:
    """One shard, written atomically (a temporary file, then a rename): it exists whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    a = shard.answers
    toks = np.concatenate([np.asarray(x.tokens, dtype=np.int64) for x in a]) if a else np.zeros(0, np.int64)
    if toks.size and (toks.min() < 0 or toks.max() > np.iinfo(np.uint16).max):
        raise ValueError("token ids must fit uint16")
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        format=np.int32(FORMAT),
        prompt_id=np.array([x.prompt_id for x in a], dtype=np.int32),
        round=np.array([x.round for x in a], dtype=np.int16),
        prompt_len=np.array([x.prompt_len for x in a], dtype=np.int32),
        prompt_crc=np.array([x.prompt_crc for x in a], dtype=np.uint32),
        answer_len=np.array([len(x.tokens) for x in a], dtype=np.int32),
        ended=np.array([x.ended for x in a], dtype=bool),
        tokens=toks.astype(np.uint16),
        temperature=np.float32(shard.temperature),
        seed=np.int64(shard.seed),
        max_new_tokens=np.int32(shard.max_new_tokens),
        meta=np.array(json.dumps(shard.meta)),
    )
    path = folder / f"shard-{index:05d}.npz"
    _atomic_write_bytes(path, buf.getvalue())
    return path


def read_shard(path: Path) -> Shard:
    with np.load(path, allow_pickle=False) as z:
        lens = z["answer_len"]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if len(lens) else []
        toks = z["tokens"].astype(np.int64)
        answers = [Answer(int(p), int(r), int(pl), int(c), toks[s : s + n].tolist(), bool(e))
                   for p, r, pl, c, s, n, e in zip(z["prompt_id"], z["round"], z["prompt_len"], z["prompt_crc"],
                                                   starts, lens, z["ended"])]
        return Shard(answers, round(float(z["temperature"]), 4), int(z["seed"]), int(z["max_new_tokens"]),
                     json.loads(str(z["meta"])))


def shard_paths(folder: Path) -> list[Path]:
    return sorted(folder.glob("shard-[0-9]*.npz"))


def clean_partial(folder: Path) -> int:
    """Remove temporary files left by a run killed mid-write; return how many."""
    n = 0
    for p in folder.glob(".*.tmp"):
        p.unlink()
        n += 1
    return n


def done_jobs(folder: Path, short_below: int = 0) -> tuple[set[tuple[int, int]], int, dict[int, bool]]:
    """(prompt id, round) pairs already answered, the next free shard index, and per answered
    prompt whether all its answers so far ended before ``short_below`` tokens."""
    done, nxt, short = set(), 0, {}
    for p in shard_paths(folder):
        with np.load(p, allow_pickle=False) as z:
            done.update(zip(z["prompt_id"].tolist(), z["round"].tolist()))
            for pid, n, e in zip(z["prompt_id"].tolist(), z["answer_len"].tolist(), z["ended"].tolist()):
                short[pid] = short.get(pid, True) and bool(e) and n < short_below
        nxt = max(nxt, int(p.stem.split("-")[1]) + 1)
    return done, nxt, short


# ============================================================================ the job schedule
def is_greedy(prompt_id: int, rnd: int, greedy_frac: float) -> bool:
    """Round 0 of a fixed, hashed fraction of the prompts is answered greedily (one greedy answer per
    prompt at most: a second would repeat it)."""
    if rnd != 0 or greedy_frac <= 0:
        return False
    return (prompt_id * 2654435761 % 2**32) / 2**32 < greedy_frac


def plan_batches(n_prompts: int, rounds: int, done: set[tuple[int, int]], batch: int, greedy_frac: float,
                 temperature: float, seed: int = 0, short: dict[int, bool] | None = None
                 ) -> Iterator[tuple[float, list[tuple[int, int]]]]:
    """(temperature, [(prompt id, round), ...]) batches of the jobs not done yet, in a fixed order:
    round by round, prompts shuffled per round; greedy and sampled jobs in separate batches.

    ``short`` (prompt id -> its earlier answers were short), read lazily as batches are planned and
    updated by the caller as shards are written, puts prompts known for short answers in batches of
    their own: ``generate`` runs until the longest row ends, so mixing lengths wastes rows. The same
    store and arguments give the same batches whenever the run is interrupted."""
    short = {} if short is None else short
    queues: dict[tuple[float, bool], list[tuple[int, int]]] = {}
    for rnd in range(rounds):
        order = list(range(n_prompts))
        random.Random(seed * 1000 + rnd).shuffle(order)
        for pid in order:
            if (pid, rnd) in done:
                continue
            key = (0.0 if is_greedy(pid, rnd, greedy_frac) else temperature, short.get(pid, False))
            q = queues.setdefault(key, [])
            q.append((pid, rnd))
            if len(q) == batch:
                yield key[0], q
                queues[key] = []
    for (t, _), q in queues.items():
        if q:
            yield t, q


def batch_seed(jobs: list[tuple[int, int]], seed: int) -> int:
    return zlib.crc32(np.asarray(jobs, dtype=np.int64).tobytes()) ^ (seed * 7919)


# ============================================================================ sampling
class _StepHook:
    """A stopping criterion that never stops rows on its own: it pauses generation while the quiet
    file exists and ends the whole batch when a stop signal arrived."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.pacer.wait_if_quiet()
        return torch.full((input_ids.shape[0],), self.pacer.stop, dtype=torch.bool, device=input_ids.device)


def encode_all(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    from ears_core.model.loading.hub import encode_prompt

    return [encode_prompt(tokenizer, p)[0].tolist() for p in prompts]


@torch.inference_mode()
def generate_answers(model: Any, prompt_ids: list[list[int]], *, eos: int, pad: int, temperature: float,
                     max_new_tokens: int, seed: int, pacer: Pacer | None = None) -> list[tuple[list[int], bool]] | None:
    """Left-padded batched ``generate``; (answer tokens through eos, ended) per prompt, or None when
    the pacer's stop flag ended the batch early (the caller drops it)."""
    from transformers import StoppingCriteriaList

    width = max(map(len, prompt_ids))
    dev = model.device
    inp = torch.tensor([[pad] * (width - len(x)) + x for x in prompt_ids], device=dev)  # (B, W)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompt_ids], device=dev)  # (B, W)
    kw: dict[str, Any] = dict(do_sample=False) if temperature == 0 else dict(do_sample=True, temperature=temperature,
                                                                               top_k=0, top_p=1.0)
    torch.manual_seed(seed)
    hooks = StoppingCriteriaList([_StepHook(pacer)]) if pacer is not None else None
    out = model.generate(inp, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                         stopping_criteria=hooks, **kw)
    if pacer is not None and pacer.stop:
        return None
    res = []
    for row in out[:, width:].tolist():
        if eos in row:
            res.append((row[: row.index(eos) + 1], True))
        else:
            res.append((row, False))
    return res


def run_sampling(model: Any, tokenizer: Any, manifest: list[dict[str, Any]], store: Path, *, rounds: int, batch: int,
                 max_new_tokens: int, temperature: float, greedy_frac: float, seed: int, pacer: Pacer,
                 max_batches: int | None = None, log: Callable[[str], None] = print) -> dict[str, float]:
    """The resumable loop: plan what is not done, generate batch by batch, one atomic shard each."""
    folder = answers_dir(store)
    folder.mkdir(parents=True, exist_ok=True)
    if n := clean_partial(folder):
        log(f"removed {n} partial file(s) of an interrupted write")
    short_below = max_new_tokens // 2
    done, index, short = done_jobs(folder, short_below)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded: dict[int, list[int]] = {}
    last_s, made, toks, active_s = None, 0, 0, 0.0
    log(f"{len(manifest)} prompts x {rounds} rounds; {len(done)} answers already in {folder}")
    for temp, jobs in plan_batches(len(manifest), rounds, done, batch, greedy_frac, temperature, seed, short):
        if max_batches is not None and made >= max_batches:
            break
        if not pacer.may_start(last_s):
            break
        for pid, _ in jobs:
            if pid not in encoded:
                encoded[pid] = encode_all(tokenizer, [manifest[pid]["prompt"]])[0]
        t = time.monotonic()
        bseed = batch_seed(jobs, seed)
        pids = [encoded[pid] for pid, _ in jobs]
        res = generate_answers(model, pids, eos=eos, pad=pad, temperature=temp, max_new_tokens=max_new_tokens,
                               seed=bseed, pacer=pacer)
        if res is None:
            break
        dt = time.monotonic() - t
        answers = [Answer(pid, rnd, len(encoded[pid]), prompt_crc(encoded[pid]), a, ended)
                   for (pid, rnd), (a, ended) in zip(jobs, res)]
        n_tok = sum(len(a.tokens) for a in answers)
        for a in answers:
            short[a.prompt_id] = short.get(a.prompt_id, True) and a.ended and len(a.tokens) < short_below
        meta = {"seconds": round(dt, 2), "threads": torch.get_num_threads(), "batch": len(jobs),
                "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        path = write_shard(folder, index, Shard(answers, temp, bseed, max_new_tokens, meta))
        index += 1
        made += 1
        toks += n_tok
        active_s += dt
        last_s = dt
        ended = sum(a.ended for a in answers) / len(answers)
        width = max(len(a.tokens) for a in answers)
        log(f"{path.name}: T={temp:g} {len(answers)} answers, {n_tok} tokens ({n_tok / dt:.0f}/s, "
            f"rows busy {n_tok / (len(answers) * width):.2f}, {ended:.2f} ended), this run {toks} tokens "
            f"{toks / max(active_s, 1e-9):.0f}/s, {pacer.elapsed() / 60:.1f} min, paused {pacer.paused_s:.0f} s")
    return {"batches": made, "tokens": toks, "active_s": active_s}


# ============================================================================ questions by the target
QUESTION_ASKS = [
    "Write one question that a curious person might ask about {t}. Reply with the question only.",
    "Ask me an interesting question about {t}. Write only the question.",
    "What is a good question a student could ask about {t}? Give just the question.",
    "Write a question someone might type into a chat assistant about {t}. Only the question.",
    "Think of a practical question about {t} that a beginner would ask. Write only the question.",
]
_BAD = re.compile(r"<\||\bquestion\b|\banswer\b|https?:|\n|[*#_`]", re.I)
# a framing clause before the quoted question: 'A curious person might ask: "What ...?'
_FRAME = re.compile(r"^[A-Z][^\"?]{0,60}?\b(ask|asks|asking|wonder|this)\b\s*[:,]?\s*[\"\u201c]", re.I)


def clean_question(text: str) -> str | None:
    """A usable question, or None: the first line, quotes, labels and a framing clause ('A student
    might ask: "...') stripped, ending with '?', 4-30 words, plain text."""
    text = text.replace("<|im_end|>", "").strip()
    line = text.split("\n", 1)[0].strip()
    line = _FRAME.sub("", line).strip().strip('"\u201c\u201d').strip("'").strip()
    line = re.sub(r"^(q(uestion)?\s*\d*\s*[:.)-]\s*)", "", line, flags=re.I).strip()
    if not line.endswith("?") or line.count("?") != 1 or _BAD.search(line):
        return None
    words = line.split()
    if not 4 <= len(words) <= 30 or not line[0].isupper():
        return None
    if sum(c.isalpha() or c.isspace() for c in line) < 0.85 * len(line):
        return None
    return line


@torch.inference_mode()
def run_questions(model: Any, tokenizer: Any, store: Path, *, count: int, batch: int, temperature: float, seed: int,
                  pacer: Pacer, log: Callable[[str], None] = print) -> int:
    from draft_prompts import TOPICS

    manifest = load_manifest(store)
    known = {re.sub(r"\W+", " ", r["prompt"].lower()).strip() for r in manifest}
    held = [h["prompt"] for h in held_out_prompts()]
    rng = random.Random(seed + len(manifest))
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    got, tried, leaks, last_s = [], 0, 0, None
    while len(got) < count and pacer.may_start(last_s):
        asks = [rng.choice(QUESTION_ASKS).format(t=rng.choice(TOPICS)) for _ in range(batch)]
        t = time.monotonic()
        res = generate_answers(model, encode_all(tokenizer, asks), eos=eos, pad=pad, temperature=temperature,
                               max_new_tokens=48, seed=rng.randrange(2**31), pacer=pacer)
        if res is None:
            break
        last_s = time.monotonic() - t
        for toks, _ in res:
            tried += 1
            q = clean_question(tokenizer.decode(toks, skip_special_tokens=True))
            if q is None:
                continue
            key = re.sub(r"\W+", " ", q.lower()).strip()
            if key in known:
                continue
            if near_held_out(q, held) is not None:
                leaks += 1
                continue
            known.add(key)
            got.append({"prompt": q, "task": "target_question", "source": "target"})
        log(f"questions: {len(got)} kept of {tried} written ({leaks} too close to held-out prompts), "
            f"{pacer.elapsed() / 60:.1f} min")
    append_manifest(store, got[:count])
    return len(got[:count])


# ============================================================================ teacher-forced features
def parse_layers(spec: str, n_layers: int) -> list[int]:
    """'last' or a comma list of hidden-state indices (0 = embeddings, i = after decoder layer i,
    'last' = after the final norm, what the EAGLE head reads) -> indices into hidden_states."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        out.append(n_layers if part == "last" else int(part))
        if not 0 <= out[-1] <= n_layers:
            raise ValueError(f"layer {part} out of range 0..{n_layers} (or 'last')")
    return out


def features_dir(cache: Path, layers_spec: str, target: str = "float") -> Path:
    """Where a feature cache lives: L<layers> for the float target, L<layers>-lean for the lean one."""
    return cache / "draft_features" / ("L" + layers_spec.replace(",", "-") + ("-lean" if target == "lean" else ""))


def shard_slice(spec: str | None) -> slice:
    """'START:STOP[:STEP]' (any part may be empty) -> a slice of the sorted answer shards; None: all."""
    if not spec:
        return slice(None)
    parts = [int(x) if x.strip() else None for x in spec.split(":")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"--shards {spec!r}: use START:STOP[:STEP]")
    return slice(*parts) if len(parts) > 1 else slice(parts[0], parts[0] + 1)


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def shard_sequences(shard: Shard, manifest: list[dict[str, Any]], tokenizer: Any,
                    cache: dict[int, list[int]] | None = None) -> list[tuple[list[int], int]]:
    """(prompt ids + answer ids, prompt length) per answer; the re-encoded prompt must match the
    length and checksum recorded when the answer was sampled."""
    cache = {} if cache is None else cache
    out = []
    for a in shard.answers:
        if a.prompt_id not in cache:
            cache[a.prompt_id] = encode_all(tokenizer, [manifest[a.prompt_id]["prompt"]])[0]
        p = cache[a.prompt_id]
        if len(p) != a.prompt_len or prompt_crc(p) != a.prompt_crc:
            raise ValueError(f"prompt {a.prompt_id} encodes differently from when it was sampled "
                             "(manifest or chat template changed): its answers cannot be used")
        out.append((p + a.tokens, len(p)))
    return out


@torch.inference_mode()
def teacher_forced(base_model: Any, seqs: list[list[int]], layers: list[int], pad: int,
                   batch_tokens: int, pacer: Pacer | None = None) -> list[np.ndarray] | None:
    """Hidden states (n - 1, len(layers), d) float16 of every position but the last, per sequence:
    right-padded batches of similar lengths through the base model (no output head)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    res: list[np.ndarray | None] = [None] * len(seqs)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= batch_tokens:
            j += 1
        if pacer is not None:
            pacer.wait_if_quiet()
            if pacer.stop:
                return None
        group = order[i:j]
        width = len(seqs[group[-1]])
        inp = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for r, k in enumerate(group):
            inp[r, : len(seqs[k])] = torch.tensor(seqs[k])
            mask[r, : len(seqs[k])] = 1
        dev = base_model.device
        hs = base_model(input_ids=inp.to(dev), attention_mask=mask.to(dev), output_hidden_states=True).hidden_states
        stacked = torch.stack([hs[l] for l in layers], dim=2).float().cpu()  # (b, W, L, d)
        for r, k in enumerate(group):
            f = stacked[r, : len(seqs[k]) - 1]
            if not torch.isfinite(f).all() or f.abs().max() > 60000:
                raise ValueError("a hidden state does not fit float16; pick other layers")
            res[k] = f.to(torch.float16).numpy()
        i = j
    return res  # type: ignore[return-value]


@torch.inference_mode()
def teacher_forced_one_by_one(model: Any, seqs: list[list[int]], layers: list[int],
                              pacer: Pacer | None = None) -> list[np.ndarray] | None:
    """``teacher_forced`` for a target that runs one sequence at a time (the lean target: batch 1, no
    padding): one pass per sequence over a fresh cache, hidden states (n - 1, len(layers), d) float16."""
    res = []
    for seq in seqs:
        if pacer is not None:
            pacer.wait_if_quiet()
            if pacer.stop:
                return None
        ids = torch.tensor([seq])
        hs = model(ids, past_key_values=model.new_cache(len(seq)), logits_to_keep=1,
                   output_hidden_states=True).hidden_states
        f = torch.stack([hs[l][0, :-1] for l in layers], dim=1).float()  # (n - 1, L, d)
        if not torch.isfinite(f).all() or f.abs().max() > 60000:
            raise ValueError("a hidden state does not fit float16; pick other layers")
        res.append(f.to(torch.float16).numpy())
    return res


def write_features(out: Path, shard_path: Path, src_sha: str, seqs: list[tuple[list[int], int]], shard: Shard,
                   feats: list[np.ndarray], layers: list[int]) -> None:
    """<shard>.f16.npy (positions, L, d) then <shard>.idx.npz; the index, written last, marks it whole."""
    out.mkdir(parents=True, exist_ok=True)
    stem = shard_path.stem
    allf = np.concatenate(feats, axis=0)
    tmp = out / f".{stem}.f16.npy.tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, allf)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / f"{stem}.f16.npy")
    n_feat = np.array([len(f) for f in feats], dtype=np.int64)
    ids = np.concatenate([np.asarray(s, dtype=np.int32) for s, _ in seqs])
    buf = io.BytesIO()
    np.savez(buf, source_sha1=np.array(src_sha), layers=np.array(layers, dtype=np.int32),
             feat_start=np.concatenate([[0], np.cumsum(n_feat)[:-1]]).astype(np.int64), n_feat=n_feat,
             ids=ids, id_start=np.concatenate([[0], np.cumsum([len(s) for s, _ in seqs])[:-1]]).astype(np.int64),
             prompt_len=np.array([p for _, p in seqs], dtype=np.int32),
             prompt_id=np.array([a.prompt_id for a in shard.answers], dtype=np.int32),
             round=np.array([a.round for a in shard.answers], dtype=np.int16),
             temperature=np.float32(shard.temperature))
    _atomic_write_bytes(out / f"{stem}.idx.npz", buf.getvalue())


def features_current(out: Path, shard_path: Path, src_sha: str) -> bool:
    idx = out / f"{shard_path.stem}.idx.npz"
    if not idx.exists() or not (out / f"{shard_path.stem}.f16.npy").exists():
        return False
    with np.load(idx, allow_pickle=False) as z:
        return str(z["source_sha1"]) == src_sha


def run_features(model: Any, tokenizer: Any, store: Path, out: Path, layers: list[int], *, batch_tokens: int,
                 pacer: Pacer, log: Callable[[str], None] = print, shards: slice = slice(None),
                 one_by_one: bool = False) -> dict[str, float]:
    """Features of every answer shard in ``shards`` not yet current in ``out``; ``one_by_one``: the target
    takes one sequence a pass (``teacher_forced_one_by_one``), else right-padded batches of its base model."""
    manifest = load_manifest(store)
    folder = answers_dir(store)
    out.mkdir(parents=True, exist_ok=True)
    clean_partial(out)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    enc: dict[int, list[int]] = {}
    made, positions, active, last_s = 0, 0, 0.0, None
    for path in shard_paths(folder)[shards]:
        sha = _sha1(path)
        if features_current(out, path, sha):
            continue
        if not pacer.may_start(last_s):
            break
        t = time.monotonic()
        shard = read_shard(path)
        seqs = shard_sequences(shard, manifest, tokenizer, enc)
        if one_by_one:
            feats = teacher_forced_one_by_one(model, [s for s, _ in seqs], layers, pacer)
        else:
            feats = teacher_forced(model.model, [s for s, _ in seqs], layers, pad, batch_tokens, pacer)
        if feats is None:
            break
        write_features(out, path, sha, seqs, shard, feats, layers)
        last_s = time.monotonic() - t
        n = sum(len(f) for f in feats)
        made, positions, active = made + 1, positions + n, active + last_s
        log(f"{path.name}: {n} positions in {last_s:.0f} s ({n / last_s:.0f}/s); this run {made} shards, "
            f"{positions} positions, {pacer.elapsed() / 60:.1f} min")
    return {"shards": made, "positions": positions, "active_s": active}


def feature_layers(folder: Path) -> list[int]:
    """The hidden-state indices a feature cache holds, in its slot order."""
    first = next(iter(sorted(folder.glob("shard-*.idx.npz"))), None)
    if first is None:
        raise FileNotFoundError(f"no features in {folder}: run `python scripts/draft_data.py features` first")
    with np.load(first, allow_pickle=False) as z:
        return [int(x) for x in z["layers"]]


def load_feature_rows(folder: Path, layer_slot: int | slice = -1, mmap: bool = True) -> list[dict[str, Any]]:
    """Rows for scripts/train_draft.py: {"ids" int32 tensor (prompt + answer), "prompt_len",
    "prompt_id", "round", "feats" (n - 1, d) float16 array (memory-mapped: read when used), or
    (n - 1, slots, d) when ``layer_slot`` is a slice of the cache's layers}."""
    rows = []
    for idx_path in sorted(folder.glob("shard-*.idx.npz")):
        stem = idx_path.name[: -len(".idx.npz")]
        allf = np.load(folder / f"{stem}.f16.npy", mmap_mode="r" if mmap else None)
        with np.load(idx_path, allow_pickle=False) as z:
            ids, id_start, fs, nf = z["ids"], z["id_start"], z["feat_start"], z["n_feat"]
            for k in range(len(nf)):
                n = int(nf[k])
                rows.append({"ids": torch.from_numpy(ids[id_start[k] : id_start[k] + n + 1].copy()),
                             "prompt_len": int(z["prompt_len"][k]), "prompt_id": int(z["prompt_id"][k]),
                             "round": int(z["round"][k]), "feats": allf[fs[k] : fs[k] + n, layer_slot]})
    return rows


# ============================================================================ command line
def _store_stats(store: Path) -> dict[str, Any]:
    manifest = load_manifest(store)
    n_ans = n_tok = n_ended = 0
    prompts, size = set(), 0
    for p in shard_paths(answers_dir(store)):
        size += p.stat().st_size
        with np.load(p, allow_pickle=False) as z:
            n_ans += len(z["answer_len"])
            n_tok += int(z["answer_len"].sum())
            n_ended += int(z["ended"].sum())
            prompts.update(z["prompt_id"].tolist())
    by_source: dict[str, int] = {}
    for r in manifest:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    return {"prompts": len(manifest), "by_source": by_source, "shards": len(shard_paths(answers_dir(store))),
            "answers": n_ans, "answer_tokens": n_tok, "ended_share": round(n_ended / max(n_ans, 1), 3),
            "prompts_answered": len(prompts), "shard_bytes": size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("command", choices=["prompts", "questions", "sample", "features", "status"])
    ap.add_argument("--store", default=str(DATA), help="the committed store (default assets/draft_data)")
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: leave a core to others)")
    ap.add_argument("--nice", type=int, default=19)
    ap.add_argument("--quiet-file", default=str(QUIET_FILE), help="pause while this file exists")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--answers", type=int, default=6, help="rounds: answers per prompt")
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--greedy-frac", type=float, default=0.25, help="share of prompts whose first answer is greedy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batches", type=int, default=None, help="stop after this many batches (tests)")
    ap.add_argument("--count", type=int, default=1500, help="questions: how many to add")
    ap.add_argument("--question-temperature", type=float, default=0.8)
    ap.add_argument("--layers", default="last", help="features: 'last' or e.g. '4,15,last'")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="features: padded tokens per forward")
    ap.add_argument("--features-out", default=None, help="default: $EARS_CACHE/draft_features/L<layers>")
    ap.add_argument("--target", choices=["float", "lean"], default="float", help="features: the float target "
                    "(EARS_LEAN=0) or the lean int4 one (EARS_LEAN=1, one answer at a time); sample and questions "
                    "always run the float target (batched generate)")
    ap.add_argument("--shards", default=None, help="features: START:STOP[:STEP], a slice of the answer shards")
    ap.add_argument("--device", default="cpu", help="where the target runs (e.g. cuda: a GPU makes "
                    "features in seconds; scripts/draft_on_gpu.sh)")
    args = ap.parse_args(argv)
    store = Path(args.store)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    if args.command == "status":
        print(json.dumps(_store_stats(store), indent=1))
        return 0
    if args.command == "prompts":
        rows = sync_manifest(store)
        print(f"{len(rows)} prompts in {manifest_path(store)}")
        return 0

    nice_and_threads(args.nice, args.threads)
    pacer = Pacer(args.minutes, Path(args.quiet_file), log=log)
    pacer.install_signals()
    from ears_core.model.loading.embedded import cache_root
    from ears_core.pair import load_pair

    os.environ["EARS_LEAN"] = "1" if args.command == "features" and args.target == "lean" else "0"
    with _SingleInstance(store, args.command):
        manifest = sync_manifest(store) if args.command == "sample" else load_manifest(store)
        if not manifest:
            sys.exit(f"no prompt manifest in {store}: run `python scripts/draft_data.py prompts` first")
        pair = load_pair("embedded", None, device=args.device)  # the target alone: no stage drafts
        model, tok = pair.target, pair.tokenizer
        log(f"{args.command}: nice {os.nice(0)}, {torch.get_num_threads()} thread(s), budget {args.minutes:g} min, "
            f"pausing while {args.quiet_file} exists")
        if args.command == "sample":
            r = run_sampling(model, tok, manifest, store, rounds=args.answers, batch=args.batch,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             greedy_frac=args.greedy_frac, seed=args.seed, pacer=pacer, max_batches=args.max_batches,
                             log=log)
            log(f"done: {r['batches']} shards, {r['tokens']} answer tokens this run "
                f"({r['tokens'] / max(r['active_s'], 1e-9):.0f}/s active); store: {json.dumps(_store_stats(store))}")
        elif args.command == "questions":
            n = run_questions(model, tok, store, count=args.count, batch=args.batch, temperature=args.question_temperature,
                              seed=args.seed, pacer=pacer, log=log)
            log(f"added {n} target-written questions; {len(load_manifest(store))} prompts in the manifest")
        elif args.command == "features":
            layers = parse_layers(args.layers, model.config.num_hidden_layers)
            out = Path(args.features_out) if args.features_out else features_dir(cache_root(), args.layers, args.target)
            r = run_features(model, tok, store, out, layers, batch_tokens=args.batch_tokens, pacer=pacer, log=log,
                             shards=shard_slice(args.shards), one_by_one=args.target == "lean")
            log(f"done: {r['shards']} shards, {r['positions']} positions this run into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
