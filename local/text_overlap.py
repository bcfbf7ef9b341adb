"""How close held-out sentences come to a training text, measured in words: shared word n-grams,
containment, nearest-neighbour word edit distance and out-of-vocabulary rate.

Sentences are strings of normalized words separated by single spaces (``local/text_normalization.py``).

>>> sharing_ngrams(["and it came to pass in those days", "the lord is my shepherd"],
...                ["it came to pass in those days that"], n=6)
[True, False]
>>> nearest_word_distances(["the lord is my shepherd"], ["the lord is our shepherd", "in the beginning"])
[1]
"""

import collections

import numpy as np
import scipy.sparse


def word_ngrams(sentence, n=6):
    """The set of word n-grams of ``sentence``; a sentence of fewer than ``n`` words is one gram, itself,
    so a short held-out sentence said inside a longer one still counts as shared."""
    words = sentence.split()
    size = min(n, len(words))
    return {tuple(words[i:i + size]) for i in range(len(words) - size + 1)}


def ngram_overlap(held_out, others, n=6):
    """Which sentences share a word n-gram across the two lists: ``(held_shared, others_shared)``,
    for each ``held_out`` sentence whether a sentence of ``others`` holds one of its n-grams (a held-out
    sentence shorter than ``n`` words: the whole of it), and for each of ``others`` whether it holds one."""
    owners = collections.defaultdict(set)
    for index, sentence in enumerate(held_out):
        for gram in word_ngrams(sentence, n):
            owners[gram].add(index)
    sizes = sorted({len(gram) for gram in owners})
    held_shared, others_shared = [False] * len(held_out), []
    for sentence in others:
        found = set().union(*(owners.get(gram, ()) for size in sizes for gram in word_ngrams(sentence, size)))
        others_shared.append(bool(found))
        for index in found:
            held_shared[index] = True
    return held_shared, others_shared


def sharing_ngrams(sentences, held_out, n=6):
    """For each of ``sentences``: whether it holds a word n-gram of a ``held_out`` sentence."""
    return ngram_overlap(held_out, sentences, n)[1]


def contained_in(queries, corpus):
    """For each query: whether it is said word for word inside (or as) a sentence of ``corpus``."""
    text = "\n".join(f" {sentence} " for sentence in corpus)
    return [f" {query} " in text for query in queries]


def oov_words(sentences, vocabulary):
    """The running words of ``sentences`` that ``vocabulary`` (a set of words) lacks, in order."""
    return [word for sentence in sentences for word in sentence.split() if word not in vocabulary]


def nearest_word_distances(queries, corpus, chunk=1024):
    """For each query, the smallest word-level Levenshtein distance (substitutions, insertions and
    deletions of whole words) to any sentence of ``corpus``. Exact, and fast enough for hundreds of
    queries against ~60,000 sentences on one core: a corpus sentence sharing ``c`` words (as a
    multiset) with a query of ``a`` words cannot be closer than ``max(a, b) - c`` for its own ``b``
    words, so candidates are scored in order of that lower bound, in chunks, until the bound reaches
    the best distance found; nothing is skipped that could be closer."""
    vocabulary = {}
    corpus_ids = [[vocabulary.setdefault(word, len(vocabulary)) for word in s.split()] for s in corpus]
    lengths = np.array([len(ids) for ids in corpus_ids])
    padded = np.full((len(corpus), max(lengths)), -1, dtype=np.int64)
    for row, ids in enumerate(corpus_ids):
        padded[row, :len(ids)] = ids
    counts = scipy.sparse.csc_matrix(
        (np.ones(lengths.sum()), (np.repeat(np.arange(len(corpus)), lengths), np.concatenate(corpus_ids))),
        shape=(len(corpus), len(vocabulary)))
    counts.sum_duplicates()
    distances = []
    for query in queries:
        ids = [vocabulary.get(word, -2) for word in query.split()]  # -2: a word no corpus sentence has
        common = np.zeros(len(corpus))
        for word, count in collections.Counter(i for i in ids if i >= 0).items():
            rows = slice(counts.indptr[word], counts.indptr[word + 1])
            common[counts.indices[rows]] += np.minimum(counts.data[rows], count)
        bound = np.maximum(lengths, len(ids)) - common
        order = np.argsort(bound, kind="stable")
        best = np.inf
        for start in range(0, len(order), chunk):
            batch = order[start:start + chunk]
            if bound[batch[0]] >= best:
                break
            width = lengths[batch].max()
            best = min(best, levenshtein_to_many(ids, padded[batch, :width], lengths[batch]).min())
        distances.append(int(best))
    return distances


def levenshtein_to_many(query, candidates, lengths):
    """Word-level Levenshtein distance of ``query`` (word ids) to each row of ``candidates`` (word ids
    padded with -1 after each row's ``lengths``), one dynamic-programming row at a time for all."""
    count, width = candidates.shape
    previous = np.tile(np.arange(width + 1), (count, 1))
    for i, word in enumerate(query, 1):
        current = np.empty_like(previous)
        current[:, 0] = i
        diagonal_or_up = np.minimum(previous[:, :-1] + (candidates != word), previous[:, 1:] + 1)
        for j in range(width):  # an insertion extends the row from its left
            current[:, j + 1] = np.minimum(diagonal_or_up[:, j], current[:, j] + 1)
        previous = current
    return previous[np.arange(count), lengths]


def overlap_report(held_out, train, lm_text, n=6, near=0.2):
    """Figures for each held-out split (``{name: [sentence, ...]}``) and for all together: word count,
    OOV rate against the vocabulary of ``train`` + ``lm_text``, sentences sharing a word ``n``-gram with
    them, sentences said inside an LM sentence, and the nearest LM sentence in word edits (min, median,
    share of sentences within ``near`` x their own length in edits)."""
    vocabulary = {word for sentence in [*train, *lm_text] for word in sentence.split()}
    splits = {**held_out, "all": [s for sentences in held_out.values() for s in sentences]}
    distances = dict(zip(splits["all"], nearest_word_distances(splits["all"], lm_text)))
    report = {}
    for name, sentences in splits.items():
        words = sum(len(s.split()) for s in sentences)
        oov = oov_words(sentences, vocabulary)
        nearest = np.array([distances[s] for s in sentences])
        relative = nearest / np.array([len(s.split()) for s in sentences])
        report[name] = {
            "sentences": len(sentences), "words": words,
            "oov_rate": round(len(oov) / words, 4), "oov_words": len(oov), "oov_types": len(set(oov)),
            f"sharing_{n}gram_with_train_or_lm": sum(ngram_overlap(sentences, [*train, *lm_text], n)[0]),
            "inside_an_lm_sentence": sum(contained_in(sentences, lm_text)),
            "nearest_lm_word_edits": {"min": int(nearest.min()), "median": float(np.median(nearest)),
                                      "max": int(nearest.max())},
            "nearest_lm_relative_edits": {"min": round(float(relative.min()), 3),
                                          "median": round(float(np.median(relative)), 3)},
            f"share_within_{round(near * 100)}pct_word_edits": round(float(np.mean(relative <= near)), 4),
        }
    return report
