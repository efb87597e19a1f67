"""Scoring a short answer: normalise the text, read the first answer in it, compare.

Terms
-----
normalised   lower case, accents dropped, number words as digits ("twenty-one" -> "21", "a hundred"
             -> "100", "negative seven" -> "-7"), thousands commas dropped ("1,000" -> "1000"), every
             other punctuation mark a space; a minus sign stays only where it makes a number negative
             ("-10", "= -7"), never between two numbers ("12-20" is 12 and 20). Tokens are the words.
number       a token such as "12", "-7" or "0.5", compared by value ("14.0" is "14"). A number is a
             whole token: "-10" holds no "0" and no "10".
candidate    what counts as an answer in a text. For a question whose answer is a number: any number.
             For a word answer: any answer (canonical or accepted) of the question's category, so
             "Kyoto, not Tokyo" reads Kyoto for the capital of Japan.
restatement  a candidate the question itself contains: "7 + 5 = 12" restates 7 and 5 before it
             answers 12; "The opposite of hot is cold" restates "hot". Restatements are skipped. For a
             number question, the article "a"/"an" counts as the number 1 ("a metre" restated as
             "1 metre"). The question set never has an answer its own question restates.
first answer the first candidate in the normalised text that is not a restatement; the answer is
             right iff it is one of the question's accepted answers (normalised). Nothing found: wrong.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Sequence

__all__ = ["normalise", "tokens", "number_value", "first_answer", "is_number_answer", "phrases"]

UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                     "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i >= 2}
SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
SIGNS = ("minus", "negative")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_DASHES = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": " ", "\u2010": "-", "\u2011": "-"})


def _ascii(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.translate(_DASHES))
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def _punctuation(text: str) -> str:
    """Drop thousands commas and apostrophes, keep decimal points and signs, the rest spaces."""
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"(?<=\w)['\u2019]s\b", "", text)  # a possessive: "Shakespeare's" -> "shakespeare"
    text = re.sub(r"(?<=\w)['\u2019](?=\w)", "", text)
    text = re.sub(r"(?<=\d)\.(?=\d)", "\0", text)  # a decimal point, kept through the next step
    text = re.sub(r"(?<=\w)\.(?=\w)", "", text)  # "d.c." -> "dc"
    text = re.sub(r"(?<![\w\0])-(?=\d)", "\1", text)  # a sign: not after a word or number
    text = re.sub(r"[^\w\0\1]+", " ", text).replace("_", " ")
    return text.replace("\0", ".").replace("\1", "-")


def _read_number(words: Sequence[str], i: int) -> tuple[int | None, int]:
    """The number spelled from words[i] on ("twenty one", "a hundred", "three thousand six hundred"),
    and the index after it; (None, i) if words[i] starts no number. Words follow one another only
    as numbers are spelled: "two four six" is three numbers, not twelve."""
    total, part, j, last = 0, 0, i, None
    if j + 1 < len(words) and words[j] in ("a", "an") and words[j + 1] in SCALES:
        part, j, last = 1, j + 1, "unit"
    while j < len(words):
        w, nxt = words[j], words[j + 1] if j + 1 < len(words) else ""
        if w in UNITS and last in (None, "tens", "scale", "and"):
            part, last = part + UNITS[w], "unit"
        elif w in TENS and last in (None, "scale", "and"):
            part, last = part + TENS[w], "tens"
        elif w in SCALES and last in ("unit", "tens"):
            total, part, last = total + part * SCALES[w], 0, "scale"
        elif w == "and" and last == "scale" and (nxt in UNITS or nxt in TENS):
            last = "and"  # "one hundred and five"
        else:
            break
        j += 1
    return (total + part, j) if last is not None else (None, i)


def _numbers_as_digits(words: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "half":
            out.append("0.5")
            i += 1
            continue
        value, j = _read_number(words, i)
        if value is None:
            out.append(w)
            i += 1
        else:
            out.append(str(value))
            i = j
    return _signs(out)


def _signs(words: list[str]) -> list[str]:
    """'negative 7' -> '-7'; 'minus 7' too, unless a number comes just before ('12 minus 7')."""
    out: list[str] = []
    for w in words:
        if out and out[-1] in SIGNS and NUMBER.fullmatch(w) and not w.startswith("-"):
            after_number = len(out) > 1 and NUMBER.fullmatch(out[-2]) is not None
            if out[-1] == "negative" or not after_number:
                out[-1] = "-" + w
                continue
        out.append(w)
    return out


def tokens(text: str) -> list[str]:
    """The normalised words of ``text`` (see the module's terms)."""
    return _numbers_as_digits(_punctuation(_ascii(text)).split())


def normalise(text: str) -> str:
    """``tokens`` joined by single spaces."""
    return " ".join(tokens(text))


def number_value(token: str) -> str | None:
    """A number token as a canonical string ("14.0" -> "14", "-7" -> "-7"); None if not a number."""
    if not NUMBER.fullmatch(token):
        return None
    x = float(token)
    return str(int(x)) if x.is_integer() else f"{x:g}"


def is_number_answer(answer: str) -> bool:
    """Whether a canonical answer is a number (then every number in a reply is a candidate)."""
    words = tokens(answer)
    return len(words) == 1 and number_value(words[0]) is not None


def phrases(answers: Iterable[str]) -> list[tuple[str, ...]]:
    """Answers as normalised word tuples, longest first (a longer phrase wins at one position)."""
    found = {tuple(tokens(a)) for a in answers}
    return sorted((p for p in found if p), key=lambda p: (-len(p), p))


def _contains(words: Sequence[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(words[i:i + n]) == phrase for i in range(len(words) - n + 1))


def first_answer(reply: str, question: str, number: bool, candidates: Sequence[tuple[str, ...]] = ()) -> str | None:
    """The first answer in ``reply`` to ``question`` (see the module's terms): a canonical number
    string if ``number``, else the first of ``candidates`` (word tuples from ``phrases``) that the
    reply holds, joined by spaces. None when the reply holds no candidate beyond restatements."""
    words, asked = tokens(reply), tokens(question)
    if number:
        skip = {number_value(w) for w in asked if number_value(w) is not None}
        if {"a", "an"} & set(asked):
            skip.add("1")
        for w in words:
            value = number_value(w)
            if value is not None and value not in skip:
                return value
        return None
    i = 0
    while i < len(words):
        hit = next((p for p in candidates if tuple(words[i:i + len(p)]) == p), None)
        if hit is None:
            i += 1
        elif _contains(asked, hit):
            i += len(hit)  # a restatement
        else:
            return " ".join(hit)
    return None
