"""A random-weight Whisper (the tests' tiny one, or whisper-tiny's shape for the benchmark), saved
as a model directory the transcriber loads: by default a
scaled-down copy of whisper-tiny's config (d_model 64, 2 encoder and 2 decoder layers, 80
mel bins, the real 30 s window of 1500 encoder positions) with a byte-level tokenizer of
its own (256 byte tokens plus Whisper's special tokens: a few languages, the tasks, the
1501 timestamps), written from dicts, so nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

# A few of Whisper's languages (its token order starts en, zh, de, es, ...: the order does
# not matter to the model, only that each code has its token).
LANGUAGES = ("en", "de", "fr", "es")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character map, which Whisper's byte-level BPE uses."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def special_tokens(languages: tuple[str, ...] = LANGUAGES) -> list[str]:
    """Whisper's special tokens in its order: end of text, start of transcript, the
    languages, the tasks, the LM/previous/no-speech/no-timestamps markers, 0.00 to 30.00."""
    return (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in languages]
            + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
               "<|nospeech|>", "<|notimestamps|>"]
            + [f"<|{i * 0.02:.2f}|>" for i in range(1501)])


def write_whisper_processor(out_dir: Path, base_vocab: int = 256,
                            languages: tuple[str, ...] = LANGUAGES) -> None:
    """A WhisperProcessor (80-bin feature extractor and the byte-level tokenizer) in
    `out_dir`. `base_vocab` above 256 fills the ordinary tokens up to that many with
    stand-ins (a real-size vocabulary, 50,257 as Whisper's, for the benchmark)."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = {ch: i for i, ch in enumerate(_bytes_to_unicode().values())}
    vocab.update({f"Ġw{i}": i for i in range(256, base_vocab)})
    (out_dir / "vocab.json").write_text(json.dumps(vocab))
    (out_dir / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = WhisperTokenizer(str(out_dir / "vocab.json"), str(out_dir / "merges.txt"),
                                 unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                 eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": special_tokens(languages)[1:]})
    extractor = WhisperFeatureExtractor(feature_size=80)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(out_dir)


def build_tiny_whisper(out_dir: Path, seed: int = 0, d_model: int = 64, layers: int = 2,
                       max_new_tokens: int | None = None, heads: int = 4,
                       base_vocab: int = 256, languages: tuple[str, ...] = LANGUAGES) -> Path:
    """Write a random-weight Whisper and its processor into `out_dir` (returned).
    `max_new_tokens`: its generation config's cap on a window's tokens (a random model
    never writes its end of text, so a server test caps each window short). The defaults
    are the tests' tiny model; whisper-tiny's shape is d_model=384, layers=4, heads=6,
    base_vocab=50257 and Whisper's 99 languages (benchmarks/transcription.py)."""
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    write_whisper_processor(out_dir, base_vocab, languages)
    tokenizer = WhisperTokenizer.from_pretrained(str(out_dir))
    ids = {t: tokenizer.convert_tokens_to_ids(t)
           for t in special_tokens(languages)[:len(languages) + 9]}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    no_timestamps = ids["<|notimestamps|>"]
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=d_model,
        encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        max_source_positions=1500, max_target_positions=448,
        decoder_start_token_id=sot, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Random weights spread the next token over 1,769 ids, 1,501 of them timestamps: the
        # byte tokens' output rows are made larger so the model writes text (what a trained
        # Whisper does between its timestamps), which the tests then compare.
        model.proj_out.weight[:base_vocab] *= 50.0
    model.save_pretrained(out_dir)
    generation = GenerationConfig(
        decoder_start_token_id=sot, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
        max_length=448, is_multilingual=True,
        lang_to_id={f"<|{c}|>": ids[f"<|{c}|>"] for c in languages},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=no_timestamps, prev_sot_token_id=ids["<|startofprev|>"],
        suppress_tokens=[], begin_suppress_tokens=[eot], begin_index=3,
        max_new_tokens=max_new_tokens)
    generation.save_pretrained(out_dir)
    return out_dir
