"""Incremental detokenization: never a broken UTF-8 character, stop strings held back."""

from __future__ import annotations

from officellm.engine.frontend.detokenizer import IncrementalDetokenizer


def _stream(tok, ids, stop=()):
    d = IncrementalDetokenizer(tok, [], list(stop))
    pieces = []
    for i, t in enumerate(ids):
        hit = d.add_token(t)
        pieces.append(d.take_delta(finished=hit is not None or i == len(ids) - 1))
        if hit:
            break
    return pieces, d


def test_multibyte_characters_split_across_tokens_stream_whole(smollm2_tokenizer):
    text = "Café ☕ 東京タワー 🎉🐙 naïve"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # byte-level BPE splits these characters
    pieces, _ = _stream(smollm2_tokenizer, ids)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == smollm2_tokenizer.decode(ids)


def test_text_that_may_start_a_stop_string_is_held_back(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("alpha beta END gamma", add_special_tokens=False)
    pieces, d = _stream(smollm2_tokenizer, ids, stop=["END"])
    assert "".join(pieces) == "alpha beta "
    assert all("E" not in p for p in pieces)


def test_stop_string_spanning_tokens_is_found(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("one two three four", add_special_tokens=False)
    pieces, d = _stream(smollm2_tokenizer, ids, stop=["o thr"])
    assert "".join(pieces) == "one tw"


def test_stop_strings_are_ignored_while_stop_checks_are_off(smollm2_tokenizer):
    """Before min_tokens a stop string neither ends the text nor cuts it."""
    ids = smollm2_tokenizer.encode("alpha END beta", add_special_tokens=False)
    d = IncrementalDetokenizer(smollm2_tokenizer, [], ["END"])
    hits = [d.add_token(t, check_stop=False) for t in ids]
    assert hits == [None] * len(ids)
    assert d.take_delta(finished=True) == "alpha END beta"
