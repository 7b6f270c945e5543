#!/usr/bin/env python3
"""Builds the tiny random-weight models the interop tests serve with vLLM on CPU.

    python scripts/interop/build-models.py OUT_DIR
    python scripts/interop/build-models.py --no-weights OUT_DIR    (for Dynamo's mocker)

No model can be downloaded here, so each model is made from scratch: a byte-level BPE tokenizer
trained on local English text (Debian's /usr/share/common-licenses and this repository's Markdown)
and a Qwen3 configuration at tiny sizes with random weights, saved as a normal Hugging Face model
folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, a ChatML chat
template, generation_config.json). Two models:

  qwen3-tiny      Qwen3ForCausalLM (dense)
  qwen3-moe-tiny  Qwen3MoeForCausalLM (the benchmark plan's architecture family: Qwen3-30B-A3B)

The tokenizer's alphabet is printable ASCII plus space and newline, so every token decodes to
whole characters on its own: a streamed token is never held back waiting for the rest of a UTF-8
sequence, and a server sends one token per chunk unless it batches chunks under load.

With `--no-weights` it builds one folder instead, `tiny-qwen3`, for Dynamo's mocker engine, which
simulates a model and reads only the tokenizer (the frontend tokenizes and applies the chat
template) and config.json (the mocker derives the KV bytes per token from it). Same tokenizer and
files as above, no model.safetensors, and a config with the attention shapes of a small real
model (28 layers, 8 KV heads of 64, bfloat16: 57,344 KV bytes per token, so the mocker's
simulated prefill-to-decode KV transfer has a realistic size) and a 32,768-token context. Needs
only `tokenizers` and `transformers`, not torch (the Dynamo venv of install-dynamo.sh has both).

Deterministic (fixed seeds); a folder is rebuilt only when its `.built` marker is missing or was
written by another version of this script.
"""

import hashlib
import json
import pathlib
import sys

BUILDER_VERSION = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus() -> list[str]:
    """Local English text, reduced to printable ASCII, space and newline."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    files = sorted(pathlib.Path("/usr/share/common-licenses").glob("*"))
    files += sorted(repo.glob("*.md")) + sorted((repo / "docs").glob("*.md"))
    keep = set(range(32, 127)) | {10}
    texts = []
    for f in files:
        if f.is_file() and not f.is_symlink():
            raw = f.read_text(errors="ignore").replace("\t", " ")
            texts.append("".join(c for c in raw if ord(c) in keep))
    if sum(len(t) for t in texts) < 100_000:
        sys.exit("build-models: not enough local text to train a tokenizer")
    return texts


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # Byte-level BPE maps every byte to a printable character; keep the ones of printable ASCII,
    # space and newline only.
    alphabet = sorted({byte_level.pre_tokenize_str(chr(b))[0][0] for b in list(range(32, 127)) + [10]})
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML
    return fast


def save_tokenizer(tokenizer, out: pathlib.Path) -> None:
    """The tokenizer files and generation_config.json, as every model folder here has them."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
    ).save_pretrained(out)
    # The chat template also as a key of tokenizer_config.json, for readers that look there.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHATML
    # The class name every transformers version knows (5.x writes its own alias otherwise), so
    # other tools' tokenizer loaders (AIPerf's) read the folder too.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def build_config_only(tokenizer, out: pathlib.Path) -> None:
    """A model folder without weights (for Dynamo's mocker): tokenizer, config.json."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=3072,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["Qwen3ForCausalLM"],
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.safetensors").unlink(missing_ok=True)
    config.save_pretrained(out)
    # The dtype under both spellings (transformers 5.x writes `dtype`, older readers want
    # `torch_dtype`); the mocker's KV-bytes estimate reads either.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = cfg["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, out)
    kv_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    print(f"built {out.name}: config and tokenizer only (no weights), vocab {len(tokenizer)}, "
          f"{kv_bytes} KV bytes per token")


def build_model(kind: str, tokenizer, out: pathlib.Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(12)
    vocab = len(tokenizer)
    common = dict(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        max_position_embeddings=8192,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    if kind == "dense":
        config = Qwen3Config(**common)
        model = Qwen3ForCausalLM(config)
    else:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            mlp_only_layers=[],
        )
        model = Qwen3MoeForCausalLM(config)
    model = model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    params = sum(p.numel() for p in model.parameters())
    print(f"built {out.name}: {config.architectures or type(model).__name__}, {params} parameters, vocab {vocab}")


def main() -> None:
    args = sys.argv[1:]
    no_weights = "--no-weights" in args
    args = [a for a in args if a != "--no-weights"]
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit(__doc__)
    root = pathlib.Path(args[0])
    if no_weights:
        wanted = {"tiny-qwen3": "config-only"}
    else:
        wanted = {"qwen3-tiny": "dense", "qwen3-moe-tiny": "moe"}
    marker = lambda name: root / name / ".built"
    stale = [
        n for n in wanted
        if not marker(n).exists() or marker(n).read_text().strip() != BUILDER_VERSION
    ]
    if not stale:
        print(f"tiny models present in {root}: {', '.join(wanted)}")
        return
    tokenizer = build_tokenizer()
    for name in stale:
        if wanted[name] == "config-only":
            build_config_only(tokenizer, root / name)
        else:
            build_model(wanted[name], tokenizer, root / name)
        (root / name / ".built").write_text(BUILDER_VERSION + "\n")


if __name__ == "__main__":
    main()
