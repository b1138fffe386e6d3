"""A synthetic note-search log: the quick-start's embedded data set.

**Everything produced here is synthetic.** It imitates a note-sharing platform
(short English notes with a title, a topic and content) with a query population,
impressions with position bias, clicks and relevance scores from a ranking
model. It exists so that the whole pipeline can run end to end without private
logs, and it is built to be *learnable*:

* a lexical signal: a note is "about" 2-3 **focus terms** of its topic, which
  appear in its title and repeatedly in its content; 3-5 other topic terms (and
  sometimes a term of an unrelated topic) are only mentioned in passing, so
  lexical matching is useful but imperfect;
* a **vocabulary gap** a trained retriever can close and a lexical one cannot:
  queries replace a doc term by its synonym from a fixed synonym table
  (synonyms never occur in notes) and contain misspellings;
* **multi-intent** queries that combine two topics;
* a hidden relevance model: ``grade(q, d)`` = 2 if the note covers the query's
  topic(s) and has all the query's intent terms as focus terms, 1 if it covers
  the topic and every intent term at least appears in it (multi-intent: one
  intent is a focus and the other terms appear), 0 otherwise. Qrels are these
  grades;
* impressions from a noisy production ranker (10 results per session, 1-3
  sessions per query), examination probability ``1 / log2(1 + position)``
  (position bias) and click probability given examination by grade
  (``click_prob``);
* a less noisy "ranking model" whose scores form the relevance log (top
  ``relevance_depth`` candidates, for a fraction of the training queries).

Logs are written only for training queries, so the test queries (``qrels/test.tsv``)
never leak into training data. The generator is deterministic given ``seed``.

Layout written by :func:`write_synthetic` (BEIR + logs)::

    corpus.jsonl  queries.jsonl  qrels/train.tsv  qrels/test.tsv
    logs/clicks.tsv  logs/relevance.tsv  build.yaml  synth.json  README.md
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from scalingnote.data.logs import ClickRecord, RelevanceRecord
from scalingnote.data.synth_types import SynthConfig, SyntheticLog
from scalingnote.data.synth_vocab import (
    ADJECTIVES,
    FILLERS,
    MULTI_TEMPLATES,
    QUERY_TEMPLATES_1,
    QUERY_TEMPLATES_2,
    QUERY_TEMPLATES_3,
    SENTENCE_TEMPLATES,
    TIMES,
    TITLE_TEMPLATES,
    VERBS,
    Topic,
    check_vocabulary,
    topics,
)
from scalingnote.data.synth_write import write_synthetic
from scalingnote.data.types import Document, Qrels, Query


@dataclass
class _Note:
    doc: Document
    topics: tuple[int, ...]  # primary first
    focus: frozenset[str]  # what the note is about
    mentions: frozenset[str]  # terms mentioned in passing


@dataclass
class _Intent:
    topic: int
    terms: tuple[str, ...]


def _zipf_weights(n: int, s: float = 0.7) -> list[float]:
    return [1.0 / (r + 1) ** s for r in range(n)]


def _weighted_sample(rng: random.Random, items, weights, k: int) -> list:
    """k distinct items, drawn without replacement proportionally to weights."""
    items, weights = list(items), list(weights)
    out = []
    for _ in range(min(k, len(items))):
        i = rng.choices(range(len(items)), weights=weights)[0]
        out.append(items.pop(i))
        weights.pop(i)
    return out


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def misspell(word: str, rng: random.Random) -> str:
    """One random edit (swap, drop, double or replace a vowel) inside a word of >= 4 letters."""
    if len(word) < 4:
        return word
    i = rng.randrange(1, len(word) - 1)
    op = rng.randrange(4)
    if op == 0:
        w = word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    elif op == 1:
        w = word[:i] + word[i + 1 :]
    elif op == 2:
        w = word[:i] + word[i] + word[i:]
    else:
        vowels = [j for j, c in enumerate(word) if c in "aeiou" and 0 < j]
        if not vowels:  # no vowel to change: double a letter instead
            w = word[:i] + word[i] + word[i:]
        else:
            j = rng.choice(vowels)
            w = word[:j] + rng.choice([v for v in "aeiou" if v != word[j]]) + word[j + 1 :]
    return w if w != word else word + word[-1]


def _make_note(
    i: int, rng: random.Random, tps: list[Topic], weights: list[list[float]], cfg: SynthConfig, width: int
) -> _Note:
    t0 = rng.randrange(len(tps))
    tids = [t0]
    if rng.random() < cfg.secondary_topic_rate:
        t1 = rng.randrange(len(tps) - 1)
        tids.append(t1 + (t1 >= t0))
    focus: list[str] = _weighted_sample(rng, tps[t0].terms, weights[t0], rng.randint(2, 3))
    if len(tids) == 2:
        focus += _weighted_sample(rng, tps[tids[1]].terms, weights[tids[1]], 2)
    background = [t for t in tps[t0].terms if t not in focus]
    mentions = rng.sample(background, rng.randint(3, 5))  # own-topic terms mentioned in passing
    if rng.random() < cfg.cross_mention_rate:  # and sometimes a term of an unrelated topic
        other = rng.choice([k for k in range(len(tps)) if k not in tids])
        mentions.append(rng.choice(tps[other].terms))
    topic_name = tps[t0].name

    f = list(focus)
    rng.shuffle(f)
    a, b = f[0], f[1]
    c = f[2] if len(f) > 2 else mentions[0]
    title = rng.choice(TITLE_TEMPLATES).format(A=_cap(a), a=a, b=b, c=c, adj=rng.choice(ADJECTIVES))
    sentences = []
    used: set[str] = set()
    for _ in range(rng.randint(5, 8)):
        # slot a: mostly a focus term; slot b: a focus term or a passing mention
        x = rng.choice(focus) if rng.random() < 0.7 else rng.choice(mentions)
        y = rng.choice(focus) if rng.random() < 0.5 else rng.choice(mentions)
        if y == x:
            y = rng.choice([m for m in mentions + focus if m != x])
        used.update((x, y))
        sentences.append(
            rng.choice(SENTENCE_TEMPLATES).format(
                A=_cap(x),
                a=x,
                b=y,
                adj=rng.choice(ADJECTIVES),
                verb=rng.choice(VERBS),
                time=rng.choice(TIMES),
                topic=topic_name,
            )
        )
    # mentions not used yet go into one closing sentence, so every mention appears
    left = [m for m in mentions if m not in used]
    if left:
        sentences.append(f"Next time I want to look into {' and '.join(left)}.")
    if rng.random() < 0.5:
        sentences.insert(rng.randrange(len(sentences) + 1), rng.choice(FILLERS))
    # fix capitalisation of sentences starting with a template slot
    sentences = [_cap(s) for s in sentences]
    topic = "; ".join(tps[t].name for t in tids)
    doc = Document(f"n{i:0{width}d}", title, topic, " ".join(sentences))
    return _Note(doc, tuple(tids), frozenset(focus), frozenset(mentions))


def _grade(intents: list[_Intent], note: _Note) -> int:
    """Hidden relevance (see the module docstring)."""
    if len(intents) == 1:
        it = intents[0]
        if it.topic not in note.topics:
            return 0
        if all(t in note.focus for t in it.terms):
            return 2
        return 1 if all(t in note.focus or t in note.mentions for t in it.terms) else 0
    # multi-intent: 2 = every intent is a focus of the note; 1 = one is, and the others are at least mentioned
    sat = [it.topic in note.topics and all(t in note.focus for t in it.terms) for it in intents]
    if all(sat):
        return 2
    if any(sat) and all(t in note.focus or t in note.mentions for it in intents for t in it.terms):
        return 1
    return 0


def _render_query(intents: list[_Intent], rng: random.Random, tps: list[Topic], cfg: SynthConfig) -> str:
    def surface(term: str, topic: int) -> str:
        syn = tps[topic].synonyms.get(term)
        if syn is not None and rng.random() < cfg.synonym_rate:
            term = syn
        if rng.random() < cfg.typo_rate:
            term = misspell(term, rng)
        return term

    if len(intents) == 2:
        a = surface(intents[0].terms[0], intents[0].topic)
        b = surface(intents[1].terms[0], intents[1].topic)
        return rng.choice(MULTI_TEMPLATES).format(a=a, b=b)
    it = intents[0]
    words = [surface(t, it.topic) for t in it.terms]
    tmpl = {1: QUERY_TEMPLATES_1, 2: QUERY_TEMPLATES_2, 3: QUERY_TEMPLATES_3}[len(words)]
    # the slot names outnumber the words of a one- or two-term query: zip stops at the words
    return rng.choice(tmpl).format(**dict(zip("abc", words, strict=False)))


def generate(cfg: SynthConfig | None = None, progress: bool = False) -> SyntheticLog:
    """Generate the synthetic corpus, queries, qrels and logs (deterministic by ``cfg.seed``)."""
    cfg = cfg or SynthConfig()
    tps = topics()
    check_vocabulary(tps)
    rng = random.Random(cfg.seed)
    # per-topic term popularity: a seeded permutation of Zipf weights
    weights = []
    for t in tps:
        w = _zipf_weights(len(t.terms))
        rng.shuffle(w)
        weights.append(w)
    width = len(str(cfg.num_docs))
    notes = [_make_note(i, rng, tps, weights, cfg, width) for i in range(cfg.num_docs)]
    by_topic: dict[int, list[int]] = {}
    for i, n in enumerate(notes):
        for tid in n.topics:
            by_topic.setdefault(tid, []).append(i)
    multi_docs = [i for i, n in enumerate(notes) if len(n.topics) == 2]

    queries, intents_of = _make_queries(notes, multi_docs, tps, rng, cfg)
    ids = [q.id for q in queries]
    rng.shuffle(ids)
    n_test = max(1, int(round(cfg.test_fraction * len(ids))))
    test_ids = set(ids[:n_test])

    # -- hidden relevance + qrels ----------------------------------------------------------------
    grades: dict[str, dict[int, int]] = {}
    for q in queries:
        cand = sorted({i for it in intents_of[q.id] for i in by_topic.get(it.topic, ())})
        g = {i: _grade(intents_of[q.id], notes[i]) for i in cand}
        grades[q.id] = {i: v for i, v in g.items() if v > 0}
    qrels: dict[str, Qrels] = {"train": {}, "test": {}}
    for q in queries:
        split = "test" if q.id in test_ids else "train"
        if grades[q.id]:
            qrels[split][q.id] = {notes[i].doc.id: v for i, v in sorted(grades[q.id].items())}

    # -- logs (training queries only) -----------------------------------------------------------
    train_queries = [q for q in queries if q.id not in test_ids]
    clicks, relevance = _simulate_logs(train_queries, intents_of, by_topic, notes, grades, rng, cfg, progress)

    meta = {
        "intents": {
            qid: [{"topic": tps[it.topic].name, "terms": list(it.terms)} for it in its]
            for qid, its in intents_of.items()
        },
        "focus": {n.doc.id: sorted(n.focus) for n in notes},
    }
    return SyntheticLog(cfg, [n.doc for n in notes], queries, qrels, clicks, relevance, test_ids, meta)


def _make_queries(
    notes: list[_Note], multi_docs: list[int], tps: list[Topic], rng: random.Random, cfg: SynthConfig
) -> tuple[list[Query], dict[str, list[_Intent]]]:
    """Distinct queries, each with the intents (topic + terms) it was generated from."""
    qwidth = len(str(cfg.num_queries))
    seen_text: set[str] = set()
    queries: list[Query] = []
    intents_of: dict[str, list[_Intent]] = {}
    attempts = 0
    while len(queries) < cfg.num_queries:
        attempts += 1
        if attempts > 50 * cfg.num_queries:
            raise ValueError("could not generate enough distinct queries; lower num_queries")
        if multi_docs and rng.random() < cfg.multi_intent_rate:
            seed_note = notes[rng.choice(multi_docs)]
            t0, t1 = seed_note.topics
            f0 = [t for t in seed_note.focus if t in tps[t0].terms]
            f1 = [t for t in seed_note.focus if t in tps[t1].terms]
            intents = [_Intent(t0, (rng.choice(sorted(f0)),)), _Intent(t1, (rng.choice(sorted(f1)),))]
        else:
            seed_note = notes[rng.randrange(len(notes))]
            t0 = seed_note.topics[0]
            own = sorted(t for t in seed_note.focus if t in tps[t0].terms)
            k = rng.choices((1, 2, 3), weights=(0.1, 0.65, 0.25))[0]
            intents = [_Intent(t0, tuple(rng.sample(own, min(k, len(own)))))]
        text = _render_query(intents, rng, tps, cfg)
        if text in seen_text:
            continue
        seen_text.add(text)
        qid = f"q{len(queries):0{qwidth}d}"
        queries.append(Query(qid, text))
        intents_of[qid] = intents
    return queries, intents_of


def _simulate_logs(
    train_queries: list[Query],
    intents_of: dict[str, list[_Intent]],
    by_topic: dict[int, list[int]],
    notes: list[_Note],
    grades: dict[str, dict[int, int]],
    rng: random.Random,
    cfg: SynthConfig,
    progress: bool,
) -> tuple[list[ClickRecord], list[RelevanceRecord]]:
    """Impressions with position-biased clicks, and noisy ranker scores, for the training queries."""
    clicks: list[ClickRecord] = []
    relevance: list[RelevanceRecord] = []
    it_q: Iterable[Query] = train_queries
    if progress:
        from tqdm.auto import tqdm

        it_q = tqdm(train_queries, desc="synthetic logs", unit="q")
    for q in it_q:
        _simulate_query(q, intents_of[q.id], by_topic, notes, grades[q.id], rng, cfg, clicks, relevance)
    return clicks, relevance


def _simulate_query(
    q: Query,
    intents: list[_Intent],
    by_topic: dict[int, list[int]],
    notes: list[_Note],
    g: dict[int, int],
    rng: random.Random,
    cfg: SynthConfig,
    clicks: list[ClickRecord],
    relevance: list[RelevanceRecord],
) -> None:
    """The impressions (appended to ``clicks``) and ranking-model scores (to ``relevance``) of one query."""
    topical = sorted({i for it in intents for i in by_topic.get(it.topic, ())})
    pool = sorted(set(topical) | set(rng.sample(range(len(notes)), 15)))
    cover = {i: any(it.topic in notes[i].topics for it in intents) for i in pool}

    def base(i: int) -> float:
        return g.get(i, 0) + 0.5 * cover[i]

    for _ in range(rng.randint(*cfg.sessions)):
        ranked = sorted(pool, key=lambda i: -(base(i) + rng.gauss(0.0, cfg.ranker_noise)))[: cfg.page_size]
        for pos, i in enumerate(ranked, start=1):
            examined = rng.random() < 1.0 / math.log2(1 + pos)  # position bias
            clicked = examined and rng.random() < cfg.click_prob[g.get(i, 0)]
            clicks.append(ClickRecord(q.id, notes[i].doc.id, pos, clicked))
    if rng.random() < cfg.relevance_coverage:
        scored = sorted(((base(i) * 1.0 + rng.gauss(0.0, cfg.relevance_noise), i) for i in pool), key=lambda x: -x[0])
        for s, i in scored[: cfg.relevance_depth]:
            relevance.append(RelevanceRecord(q.id, notes[i].doc.id, round(s, 4)))


#: ``generate`` under an unambiguous name for ``scalingnote.data``'s namespace.
generate_synthetic = generate


def synthesize(out: str | Path, cfg: SynthConfig | None = None, progress: bool = False) -> SyntheticLog:
    """:func:`generate` + :func:`write_synthetic`."""
    log = generate(cfg, progress=progress)
    write_synthetic(out, log)
    return log
