"""What create-data says about a corpus's structure when it looks guessed wrong: a repeated marker line that may
separate documents (``--doc_separator``), and a held-out share of the text far from ``--eval_fraction``."""

from __future__ import annotations

import shlex

MARKER_REPEATS = 3  # a marker line seen fewer times than this is no structure


def separator_hint(stats) -> str:
    """Where a short line of symbols alone (``%``, ``***``: :meth:`.corpus.CorpusStats.note_marker`) outnumbers the
    documents read (blank lines end documents): the hint of ``--doc_separator`` naming it; empty otherwise."""
    if not stats.marker_lines:
        return ""
    marker, count = max(stats.marker_lines.items(), key=lambda item: item[1])
    if count < MARKER_REPEATS or count <= stats.documents:
        return ""
    return (f"The corpus was read as {stats.documents} document(s) (blank lines end a document), but the line "
            f"{marker!r} stands alone on {count} lines: if it separates documents, give --doc_separator "
            f"{shlex.quote(marker)} (documents decide the held-out split, next-sentence pairs and document masks).")


def held_out_hint(counts: dict[str, int], characters: dict[str, int], eval_fraction: float) -> str:
    """Where the held-out share of the text is far from eval_fraction (a third of it or 3 times, and 2 points
    away): why, and what brings it closer; empty otherwise. ``counts``/``characters``: documents and characters
    dealt to ``train`` and ``eval``."""
    text = sum(characters.values())
    if not (eval_fraction and counts["eval"] and text):
        return ""
    share = characters["eval"] / text
    if abs(share - eval_fraction) <= 0.02 or eval_fraction / 3 <= share <= 3 * eval_fraction:
        return ""
    documents = sum(counts.values())
    return (f"Held out for evaluation: {counts['eval']} of {documents} documents, {share:.1%} of the text, where "
            f"eval_fraction={eval_fraction} asks for {eval_fraction:.1%}: documents are held out whole, at random "
            f"(and at least one), so {'few' if documents < 100 else 'uneven'} documents make the share of text "
            "differ. More, shorter documents (blank lines or --doc_separator between them) bring it closer; "
            "--eval_fraction sets the share.")
