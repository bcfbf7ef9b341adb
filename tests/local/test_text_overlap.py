"""local/text_overlap.py: shared word n-grams, containment, exact nearest word edit distance, OOV."""

import numpy as np

from local import text_overlap
from local.text_overlap import contained_in, nearest_word_distances, ngram_overlap, oov_words, overlap_report


def word_levenshtein(first, second):
    """Textbook dynamic programme over whole words, the reference for the fast search."""
    previous = list(range(len(second) + 1))
    for i, word in enumerate(first, 1):
        current = [i]
        for j, other in enumerate(second, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1]


def random_sentences(rng, count, vocabulary=12, lengths=(1, 14)):
    words = [f"w{i}" for i in range(vocabulary)]
    return [" ".join(rng.choice(words, size=rng.integers(*lengths))) for _ in range(count)]


def test_nearest_word_distances_are_exact():
    """The pruned search finds the same minimum as scoring every pair, on a small vocabulary where
    many candidates tie on the lower bound and with chunks small enough that pruning happens; a query
    word no corpus sentence has counts as an edit."""
    rng = np.random.default_rng(3)
    corpus = random_sentences(rng, 400)
    queries = random_sentences(rng, 40) + ["unknown w1 w2", corpus[5]]
    expected = [min(word_levenshtein(q.split(), s.split()) for s in corpus) for q in queries]
    assert nearest_word_distances(queries, corpus, chunk=16) == expected
    assert expected[-1] == 0 and nearest_word_distances(["a b c"], ["a x c d", "q"]) == [2]


def test_levenshtein_to_many_ignores_padding():
    """Each row's distance counts only its own words, whatever padding follows them."""
    candidates = np.array([[1, 2, 3, -1], [1, 3, -1, -1], [4, 4, 4, 4]])
    assert text_overlap.levenshtein_to_many([1, 2, 3], candidates, np.array([3, 2, 4])).tolist() == [0, 1, 4]


def test_ngram_overlap_counts_six_grams_and_whole_short_sentences():
    """A 6-word run shared counts, 5 shared words do not, unless the held-out sentence has only 5;
    both directions of the relation are reported."""
    held_out = ["a b c d e f g", "p q r s t"]
    others = ["x a b c d e f", "x a b c d e y", "z p q r s t z", "q r s t"]
    assert ngram_overlap(held_out, others) == ([True, True], [True, False, True, False])
    assert text_overlap.word_ngrams("a b c", 6) == {("a", "b", "c")}


def test_containment_oov_and_report():
    """Containment respects word boundaries; OOV words are counted per running word; the report
    puts the figures of each split and of all together."""
    assert contained_in(["b c", "b", "c d e"], ["ab c d", "a b c d"]) == [True, True, False]
    assert oov_words(["a b a", "c"], {"b"}) == ["a", "a", "c"]
    report = overlap_report({"dev": ["a b c d e"], "test": ["k l m n o p"]}, ["a b c d e f g"], ["k l m n o q"])
    assert report["dev"]["sharing_6gram_with_train_or_lm"] == 1 and report["dev"]["oov_rate"] == 0
    assert report["test"]["nearest_lm_word_edits"]["min"] == 1 and report["test"]["share_within_20pct_word_edits"] == 1
    assert report["all"]["sentences"] == 2 and report["all"]["oov_words"] == 1
