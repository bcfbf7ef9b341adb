"""Transcripts as words: lower case, numbers spelled out, punctuation dropped; and the sentences of
the open corpus, taken from the King James Bible (public domain) that Debian's bible-kjv ships.

>>> normalize_transcript("In the 2nd year, Ben-hadad's 120 men came (at noon).")
"in the second year ben hadad's one hundred and twenty men came at noon"
>>> spell_number(1984)
'one thousand nine hundred and eighty four'
"""

import re
import shutil
import subprocess

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
ORDINAL_ENDINGS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                   "nine": "ninth", "twelve": "twelfth"}
KJV_BOOKS = "Gen1:1-Rev22:21"


def spell_number(number):
    """A non-negative integer in words, British style ('one hundred and five')."""
    if number < 20:
        return ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return TENS[tens] + ("" if ones == 0 else " " + ONES[ones])
    for scale, name in SCALES:
        if number >= scale:
            high, rest = divmod(number, scale)
            joiner = " and " if rest < 100 else " "
            return f"{spell_number(high)} {name}" + ("" if rest == 0 else joiner + spell_number(rest))
    raise AssertionError("unreachable")


def spell_ordinal(number):
    """'twenty first' for 21."""
    words = spell_number(number).split()
    last = words[-1]
    if last in ORDINAL_ENDINGS:
        words[-1] = ORDINAL_ENDINGS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def _spell_match(match):
    digits, suffix = match.group(1).replace(",", ""), match.group(2)
    number = int(digits)
    return f" {spell_ordinal(number) if suffix else spell_number(number)} "


def normalize_transcript(text):
    """Words only: numbers (and ordinals such as 2nd) spelled out, hyphens and dashes as spaces,
    other punctuation removed, apostrophes inside words kept, lower case, single spaces."""
    text = re.sub(r"(\d[\d,]*)(st|nd|rd|th)?\b", _spell_match, text)
    text = re.sub(r"[-\u2013\u2014_/]", " ", text.lower())
    text = re.sub(r"[^a-z' ]", " ", text)
    words = [word.strip("'") for word in text.split()]
    return " ".join(word for word in words if word)


def split_sentences(verse, max_words=22):
    """Pieces of a verse that read as sentences: cut at . ; : ? ! and, when still longer than
    ``max_words``, at commas (pieces are joined back while they stay short)."""
    pieces = []
    for sentence in re.split(r"(?<=[.;:?!])\s+", verse.strip()):
        if len(sentence.split()) <= max_words:
            pieces.append(sentence)
            continue
        current = ""
        for clause in re.split(r"(?<=,)\s+", sentence):
            if current and len((current + " " + clause).split()) > max_words:
                pieces.append(current)
                current = clause
            else:
                current = f"{current} {clause}".strip()
        pieces.append(current)
    return [piece for piece in pieces if piece]


def kjv_verses():
    """The 31,102 verses of the King James Bible as ``(book, verse text)``, in book order, from the
    ``bible`` program (Debian: bible-kjv)."""
    if shutil.which("bible") is None:
        raise SystemExit("error: the open corpus reads the King James Bible with the `bible` program: "
                         "install it with `apt-get install bible-kjv` (make setup does)")
    listing = subprocess.run(["bible", "-l", "100000", KJV_BOOKS], check=True, capture_output=True,
                             text=True).stdout
    verses, book = [], None
    for line in listing.splitlines():
        heading, verse = re.fullmatch(r"(\S.*\S) \d+", line), re.fullmatch(r"\s+\d+ (.+)", line)
        if heading:
            book = heading.group(1)  # "Genesis 1" heads chapter 1 of Genesis; "1 Samuel 3", "Song of Solomon 2"
        elif verse:
            verses.append((book, verse.group(1)))
    return verses


def kjv_sentences(min_words=5, max_words=22):
    """Distinct ``(book, spoken text, transcript)`` triples from the KJV, in book order: the spoken
    text keeps its punctuation (the synthesizers pause at it), the transcript is normalized; a
    transcript said in several books belongs to the first."""
    triples, seen = [], set()
    for book, verse in kjv_verses():
        for piece in split_sentences(verse, max_words):
            transcript = normalize_transcript(piece)
            if min_words <= len(transcript.split()) <= max_words and transcript not in seen:
                seen.add(transcript)
                triples.append((book, piece.strip(" ,;:"), transcript))
    return triples
