"""Prompt sets for training the embedded draft and for held-out evaluation (never overlap).

Training prompts are templates x topics; the held-out set (assets/prompts.json, also the
benchmark's prompt set) uses its own hand-written prompts whose topics are not in the training list.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

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


if __name__ == "__main__":
    p = training_prompts()
    print(len(p), "training prompts; e.g.", p[:3])
    held = {x["prompt"] for x in held_out_prompts()}
    assert not held & set(p), "held-out prompts leak into training"
