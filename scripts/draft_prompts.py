"""Prompt sets for training the embedded draft and for held-out evaluation (never overlap).

Training prompts are templates x topics; the held-out set (assets/prompts.json, also the
benchmark's prompt set) uses its own hand-written prompts whose topics are not in the training list.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path
from typing import Iterable

TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "What are the main facts everyone should know about {t}?",
    "Write a short story that involves {t}.",
    "Write a poem about {t}.",
    "Give me five tips related to {t}.",
    "What is the history of {t}? Answer in a paragraph.",
    "Describe the pros and cons of {t}.",
    "Write a short blog post introduction about {t}.",
    "How would you teach a beginner about {t}? Give a step-by-step plan.",
    "Summarise the key ideas behind {t} in three sentences.",
    "Write a dialogue between two friends discussing {t}.",
    "What are common misconceptions about {t}?",
    "Write a haiku and then a limerick about {t}.",
    "Answer briefly: why does {t} matter?",
]
TOPICS = [
    "photosynthesis", "volcanoes", "the French Revolution", "black holes", "recycling", "honey bees",
    "the water cycle", "electric cars", "chess", "the Roman Empire", "vaccines", "rainbows",
    "machine learning", "the human heart", "coffee", "the Moon landing", "earthquakes", "penguins",
    "saving money", "learning a new language", "climate change", "the internet", "dinosaurs",
    "gardening", "the Olympic Games", "sleep", "friendship", "mountains", "jazz music", "bread baking",
    "solar panels", "the printing press", "octopuses", "time management", "the pyramids of Egypt",
    "public libraries", "bicycles", "the immune system", "deserts", "cloud computing",
    "the stock market", "Mars exploration", "origami", "rain forests", "the piano", "healthy eating",
    "trains", "lighthouses", "the periodic table", "birds migrating", "video games", "tea",
]
MATH = [
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost? Explain step by step.",
    "Tom has {a} apples and gives away {b}. Then he buys {c} more. How many apples does he have?",
    "A train travels {a} km in {b} hours. What is its average speed? Show your work.",
    "What is {a} times {b}, plus {c}? Work it out step by step.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "If {a} workers build a wall in {b} days, how long would {c} workers take? Explain.",
]
CODE = [
    "Write a Python function that {t}.",
    "Explain what this does and improve it: a Python loop that {t}.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a sentence",
    "returns the largest item of a list", "computes the factorial of n", "merges two sorted lists",
    "removes duplicates from a list", "converts Celsius to Fahrenheit", "reads a file and counts lines",
    "finds the average of a list of numbers", "checks if a word is a palindrome", "sorts a dictionary by value",
]


def training_prompts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = [t.format(t=topic) for t, topic in itertools.product(TEMPLATES, TOPICS)]
    for tpl in MATH:
        for _ in range(12):
            a, b, c = rng.randint(2, 60), rng.randint(2, 12), rng.randint(2, 30)
            out.append(tpl.format(a=a, b=b, c=c))
    out += [t.format(t=task) for t, task in itertools.product(CODE, CODE_TASKS)]
    rng.shuffle(out)
    return out


def held_out_prompts() -> list[dict[str, str]]:
    path = Path(__file__).resolve().parent.parent / "assets" / "prompts.json"
    return json.loads(path.read_text())["prompts"]


class HeldOutLeak(ValueError):
    """A training prompt equals, contains, or nearly repeats a held-out prompt of assets/prompts.json."""


_STOP = set("""a an the and or but of to in on at for from by with about as is are was were be been it its this
that these those what which who whom whose why how when where do does did doing can could would should will
shall may might must i you he she we they me him her us them my your his our their there here not no so if
then than too very just into out up down over under again more most some any each every all both few other
such only own same one two three after before while during because through between also please write give tell
explain describe""".split())


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def near_held_out(prompt: str, held: Iterable[str], jaccard: float = 0.6) -> str | None:
    """The held-out prompt that ``prompt`` repeats, else None. A repeat is: the same words (case,
    spacing and punctuation ignored); one containing the other (4+ words); or content-word sets
    (stop words dropped) sharing 2+ words with Jaccard similarity >= ``jaccard`` (a reworded copy,
    e.g. the same word problem with other phrasing)."""
    w = _words(prompt)
    s, ws = " ".join(w), {x for x in w if x not in _STOP}
    for h in held:
        hw = _words(h)
        hs, hws = " ".join(hw), {x for x in hw if x not in _STOP}
        if s == hs or (len(hw) >= 4 and f" {hs} " in f" {s} ") or (len(w) >= 4 and f" {s} " in f" {hs} "):
            return h
        common = len(ws & hws)
        if common >= 2 and common / len(ws | hws) >= jaccard:
            return h
    return None


def held_out_leaks(prompts: Iterable[str], held: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(training prompt, held-out prompt) for every training prompt that repeats a held-out one."""
    held = [x["prompt"] for x in held_out_prompts()] if held is None else list(held)
    return [(p, h) for p in prompts if (h := near_held_out(p, held)) is not None]


def assert_no_held_out(prompts: Iterable[str], held: Iterable[str] | None = None) -> None:
    """Fail loudly if any training prompt repeats a held-out prompt (assets/prompts.json)."""
    leaks = held_out_leaks(prompts, held)
    if leaks:
        shown = "\n".join(f"  {p!r} ~ held-out {h!r}" for p, h in leaks[:10])
        raise HeldOutLeak(f"{len(leaks)} training prompt(s) repeat held-out prompts of assets/prompts.json "
                          f"(the evaluation set must never be trained on):\n{shown}")


if __name__ == "__main__":
    p = training_prompts()
    print(len(p), "training prompts; e.g.", p[:3])
    assert_no_held_out(p)
