"""The capstone's text: a character tokenizer and a generated corpus with real structure.

Nothing is downloaded: `corpus(n_chars, seed)` writes English-like text from a small probabilistic
grammar over a fixed lexicon, mixed with lines of arithmetic, number sequences and dates. It is
built so that speculative decoding has something to show:
- much of it is easy to predict from the last few characters (the rest of a word, the space after
  it, the period after "quickly"): a one-layer draft gets these right, so it agrees with the target
  most of the time;
- some of it needs longer-range structure: subject-verb agreement across a relative clause ("the
  foxes that the child sees RUN"), one tense through a sentence, "a" against "an", a closing
  quote, the sum of two numbers, the next term of a sequence. The larger target learns more of
  it than the draft, so the draft is wrong sometimes, which is what tree drafting is for.
Deterministic: the same (n_chars, seed) gives the same text on every machine (Python's `random`
with its own generator; no hashing of sets).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

# The alphabet, index = token id: 80 characters, a multiple of 16 (no padded embedding rows, so the
# model can never emit a token that `decode` refuses).
VOCAB = ("\n " + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "0123456789"
         + ".,;:?!'\"-+=*/()%")
VOCAB_SIZE = len(VOCAB)
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}
assert VOCAB_SIZE == 80 and len(_INDEX) == VOCAB_SIZE


def encode(text: str) -> list[int]:
    """Token ids of `text`, one per character; ValueError naming the first character outside VOCAB."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    try:
        return [_INDEX[ch] for ch in text]
    except KeyError:
        for pos, ch in enumerate(text):
            if ch not in _INDEX:
                raise ValueError(f"text contains {ch!r} at position {pos}, which is not in the capstone's "
                                 f"alphabet (course.capstone.text.VOCAB)") from None
        raise


def decode(tokens: Iterable[int]) -> str:
    """The text of token ids (a list, or a 1-D tensor); ValueError naming an id outside [0, VOCAB_SIZE)."""
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    out = []
    for pos, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < VOCAB_SIZE:
            raise ValueError(f"tokens[{pos}] = {t!r} is not a token id in [0, {VOCAB_SIZE})")
        out.append(VOCAB[t])
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# The lexicon. Nouns: (singular, plural, is_person). Verbs: (3rd singular present, plural present,
# past). Everything lower case; the grammar capitalizes sentence starts.
NOUNS = [
    ("cat", "cats", False), ("dog", "dogs", False), ("fox", "foxes", False), ("owl", "owls", False),
    ("horse", "horses", False), ("mouse", "mice", False), ("bird", "birds", False),
    ("child", "children", True), ("teacher", "teachers", True), ("farmer", "farmers", True),
    ("king", "kings", True), ("queen", "queens", True), ("sailor", "sailors", True),
    ("engineer", "engineers", True), ("artist", "artists", True), ("baker", "bakers", True),
    ("river", "rivers", False), ("city", "cities", False), ("apple", "apples", False),
    ("box", "boxes", False), ("letter", "letters", False), ("garden", "gardens", False),
    ("island", "islands", False), ("window", "windows", False), ("lamp", "lamps", False),
    ("elephant", "elephants", False), ("orange", "oranges", False), ("idea", "ideas", False),
]
NAMES = ["Alice", "Bruno", "Clara", "David", "Elena", "Felix", "Grace", "Hugo", "Iris", "Jonas",
         "Kira", "Leo", "Mira", "Nadia", "Oscar", "Paula"]
ADJECTIVES = ["small", "old", "quiet", "red", "happy", "clever", "ancient", "green", "tired", "brave",
              "empty", "honest", "young", "heavy", "bright", "strange", "eager", "idle", "orange",
              "open", "gentle", "wild"]
TRANSITIVE = [
    ("sees", "see", "saw"), ("chases", "chase", "chased"), ("likes", "like", "liked"),
    ("finds", "find", "found"), ("carries", "carry", "carried"), ("watches", "watch", "watched"),
    ("follows", "follow", "followed"), ("paints", "paint", "painted"), ("visits", "visit", "visited"),
    ("remembers", "remember", "remembered"), ("builds", "build", "built"), ("opens", "open", "opened"),
]
INTRANSITIVE = [
    ("sleeps", "sleep", "slept"), ("runs", "run", "ran"), ("sings", "sing", "sang"),
    ("waits", "wait", "waited"), ("laughs", "laugh", "laughed"), ("swims", "swim", "swam"),
    ("works", "work", "worked"), ("dreams", "dream", "dreamed"),
]
ADVERBS = ["quickly", "slowly", "quietly", "often", "again", "carefully", "happily", "every day",
           "at night", "in the morning"]
PREPOSITIONS = ["near", "under", "behind", "across", "beside", "without", "with", "above"]
CONJUNCTIONS = ["and", "but", "because", "while", "so"]
SPEECH = [("says", "say", "said"), ("asks", "ask", "asked"), ("whispers", "whisper", "whispered")]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class _Grammar:
    """A probabilistic grammar; each method returns a phrase (a list of words) and its features."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def noun_phrase(self, depth: int, tense: int) -> tuple[list[str], bool]:
        """A noun phrase and whether it is plural. Determiner agrees in number; "a" becomes "an"
        before a vowel; a relative clause (depth permitting) has its own agreement."""
        if self.chance(0.15):
            return [self.pick(NAMES)], False
        singular, plural_form, person = self.pick(NOUNS)
        plural = self.chance(0.4)
        words = []
        if self.chance(0.5):
            words.append(self.pick(ADJECTIVES))
            if self.chance(0.2):
                words.append(self.pick(ADJECTIVES))
        words.append(plural_form if plural else singular)
        if plural:
            det = self.pick(["the", "the", "some", "many", "these", "those", "two", "three"])
        else:
            det = self.pick(["the", "the", "a", "a", "every", "this", "that"])
            if det == "a" and words[0][0] in "aeiou":
                det = "an"
        words.insert(0, det)
        if depth > 0 and self.chance(0.25):
            rel = "who" if person and self.chance(0.7) else "that"
            if self.chance(0.5):  # subject relative: "the fox that chases the birds"
                words += [rel] + self.verb_phrase(plural, depth - 1, tense, allow_pp=False)
            else:  # object relative: "the fox that the birds chase"
                subject, sub_plural = self.noun_phrase(0, tense)
                verb = self.pick(TRANSITIVE)
                words += ["that"] + subject + [self.inflect(verb, sub_plural, tense)]
        return words, plural

    @staticmethod
    def inflect(verb, plural: bool, tense: int) -> str:
        if tense == 1:
            return verb[2]
        return verb[1] if plural else verb[0]

    def verb_phrase(self, plural: bool, depth: int, tense: int, allow_pp: bool = True) -> list[str]:
        if self.chance(0.6):
            words = [self.inflect(self.pick(TRANSITIVE), plural, tense)]
            words += self.noun_phrase(depth, tense)[0]
        else:
            words = [self.inflect(self.pick(INTRANSITIVE), plural, tense)]
        if allow_pp and self.chance(0.3):
            words += [self.pick(PREPOSITIONS)] + self.noun_phrase(0, tense)[0]
        if self.chance(0.3):
            words.append(self.pick(ADVERBS))
        return words

    def clause(self, depth: int, tense: int) -> list[str]:
        subject, plural = self.noun_phrase(depth, tense)
        return subject + self.verb_phrase(plural, depth, tense)

    def sentence(self) -> str:
        """One sentence in one tense (0 present, 1 past): a statement, a compound, a question or
        a quotation."""
        tense = 1 if self.chance(0.4) else 0
        kind = self.rng.random()
        if kind < 0.12:  # question: "Does the fox ...?" / "Did ...?"
            subject, plural = self.noun_phrase(1, tense)
            aux = "did" if tense == 1 else ("do" if plural else "does")
            verb = self.pick(TRANSITIVE + INTRANSITIVE)[1]  # bare form after the auxiliary
            words = [aux] + subject + [verb]
            if verb in {v[1] for v in TRANSITIVE}:
                words += self.noun_phrase(0, tense)[0]
            return _capitalize(" ".join(words)) + "?"
        if kind < 0.22:  # quotation: The farmer said, "The owls sleep."
            speaker, plural = self.noun_phrase(0, tense)
            inner = self.clause(0, self.rng.randrange(2))
            end = self.pick([".", ".", "!", "?"])
            verb = self.inflect(self.pick(SPEECH), plural, tense)
            return (_capitalize(" ".join(speaker + [verb])) + ", \"" + _capitalize(" ".join(inner))
                    + end + "\"")
        words = self.clause(2, tense)
        while self.chance(0.3):
            words[-1] += "," if self.chance(0.5) else ""
            words += [self.pick(CONJUNCTIONS)] + self.clause(1, tense)
        if self.chance(0.15):  # an opening adverbial that agrees with the tense
            openers = ["Yesterday,", "Later,", "Then", "Suddenly,"] if tense else ["Today,", "Now", "Often,"]
            words = [self.pick(openers)] + words
        return _capitalize(" ".join(words)) + self.pick([".", ".", ".", ".", "!"])

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(1 + self.rng.randrange(4)))

    def arithmetic(self) -> str:
        a, b = self.rng.randrange(100), self.rng.randrange(100)
        op = self.pick(["+", "+", "-", "*"])
        if op == "-" and b > a:
            a, b = b, a
        if op == "*":
            a, b = self.rng.randrange(13), self.rng.randrange(13)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return f"{a} {op} {b} = {value}."

    def sequence(self) -> str:
        start, stride = self.rng.randrange(20), 1 + self.rng.randrange(12)
        n = 5 + self.rng.randrange(5)
        return ", ".join(str(start + i * stride) for i in range(n)) + "."

    def date(self) -> str:
        m = self.rng.randrange(12)
        day = 1 + self.rng.randrange(DAYS_IN_MONTH[m])
        year = 1900 + self.rng.randrange(130)
        if self.chance(0.5):
            sentence = self.sentence()
            if not sentence.startswith(tuple(NAMES)):
                sentence = sentence[0].lower() + sentence[1:]
            return f"On {day} {MONTHS[m]} {year}, " + sentence
        return f"{self.pick(WEEKDAYS)} comes after {self.pick(WEEKDAYS)}." if self.chance(0.1) else \
            f"{MONTHS[m]} has {DAYS_IN_MONTH[m]} days."

    def line(self) -> str:
        r = self.rng.random()
        if r < 0.70:
            return self.paragraph()
        if r < 0.82:
            return self.arithmetic()
        if r < 0.92:
            return self.sequence()
        return self.date()


def _capitalize(s: str) -> str:
    return s[:1].upper() + s[1:]


def corpus(n_chars: int, seed: int) -> str:
    """Exactly n_chars characters of generated text (lines separated by "\\n"), deterministic in seed.

    Different seeds give independent text: train on one seed and hold out another.
    """
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 0:
        raise ValueError(f"n_chars must be an int >= 0, got {n_chars!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    grammar = _Grammar(random.Random(seed))
    parts, total = [], 0
    while total < n_chars:
        line = grammar.line() + "\n"
        parts.append(line)
        total += len(line)
    return "".join(parts)[:n_chars]
