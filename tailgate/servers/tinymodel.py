"""A tiny Llama model directory that vLLM can serve with ``--load-format dummy``.

Tail-latency experiments need a real scheduler, not a real model: random weights are fine as long as
vLLM finds a ``config.json`` and a tokenizer. The tokenizer is a word-level vocabulary split on
whitespace, so ``"ocean " * n`` is exactly ``n`` prompt tokens and the suite controls prompt lengths
without a model download.

This module runs as a script under the vLLM environment's interpreter (``python tinymodel.py OUTDIR``),
where ``tokenizers`` is installed. It therefore imports nothing from the rest of the package, and imports
``tokenizers`` only when the tokenizer is built, so importing it elsewhere stays cheap and safe.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a name for the checker only: at run time this script imports nothing of the package
    from tailgate.jsontypes import JsonObject

VOCAB_SIZE = 1024
MAX_POSITIONS = 16384
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
PROMPT_WORD = "ocean"

#: Fixed ids: specials first, then the prompt word; every other id is the filler word ``w<id>``.
SPECIAL_IDS: dict[str, int] = {UNK: 0, BOS: 1, EOS: 2}
PROMPT_WORD_ID = 3


def vocabulary(size: int = VOCAB_SIZE) -> dict[str, int]:
    """Token → id for every id below ``size``, so any id random weights sample decodes to a word."""
    vocab = dict(SPECIAL_IDS)
    vocab[PROMPT_WORD] = PROMPT_WORD_ID
    for i in range(PROMPT_WORD_ID + 1, size):
        vocab[f"w{i}"] = i
    return vocab


def model_config(max_positions: int = MAX_POSITIONS) -> JsonObject:
    """A 2-layer Llama small enough that a 2-core CPU still runs a scheduler-bound engine."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": SPECIAL_IDS[BOS],
        "eos_token_id": SPECIAL_IDS[EOS],
        "initializer_range": 0.02,
        "use_cache": True,
    }


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A chat template for ``/v1/chat/completions``: each marker is one (unknown) word, so a chat prompt is its
words plus ``2 × messages + 1`` tokens, the same rule the ground-truth server counts by."""


def tokenizer_config(max_positions: int = MAX_POSITIONS) -> JsonObject:
    """Settings for ``transformers``: no BOS/EOS added, so a prompt's token count is its word count."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": max_positions,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def build_tokenizer() -> Any:
    """The word-level ``tokenizers.Tokenizer``; imported lazily because only the vLLM environment has it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Every token is a whole word; no token starts with "##", so decoding joins them with single spaces.
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.add_special_tokens([UNK, BOS, EOS])
    return tokenizer


def make_model(directory: str | Path) -> Path:
    """Write ``config.json``, ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}, indent=2) + "\n"
    )
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": SPECIAL_IDS[BOS], "eos_token_id": SPECIAL_IDS[EOS]}, indent=2) + "\n"
    )
    # config.json last: its presence is what callers check to decide the directory is complete.
    (out / "config.json").write_text(json.dumps(model_config(), indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Build the model directory and check the one property the suite relies on."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="output directory (created if missing)")
    args = parser.parse_args(argv)
    out = make_model(args.directory)
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode((PROMPT_WORD + " ") * 50).ids
    if ids != [PROMPT_WORD_ID] * 50:
        print(f"tokenizer check failed: 50 prompt words encoded to {len(ids)} tokens", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
