"""Finding a Hugging Face encoder and its tokenizer: a local folder `save_pretrained` wrote, or a hub name (from the
Hugging Face cache, else downloaded into it where the hub is reachable).

Everything is refused in one line that names what is missing: a folder without config.json or without the
tokenizer's files, a model that is not an encoder (GPT-2, T5), a hub name that cannot be downloaded here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lightning_template.engine.errors import ConfigError, MissingFileError, MissingPackageError
from lightning_template.tasks.classification.models.pretrained import reachable

try:
    import transformers
    from huggingface_hub import constants
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    from transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig, PreTrainedModel
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
except ImportError as err:
    raise MissingPackageError(
        "HFClassifier needs transformers and peft: uv sync --inexact --extra hf"
        " (make train CONFIG=configs/hf_fortunes.yaml does)."
    ) from err

transformers.utils.logging.set_verbosity_error()  # "weights not used: pooler..." for every encoder without its head
transformers.utils.logging.disable_progress_bar()

# The families whose own sequence classifiers read the first token ([CLS], <s>); the others pool the mean. A config's
# `classifier_pooling` (ModernBERT) wins.
CLS_FAMILIES = {
    "albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert", "electra", "ernie", "mpnet", "roberta",
    "xlm-roberta", "xlm-roberta-xl",
}  # fmt: skip
# LoRA's targets where peft has none: the attention's query and value projections.
LORA_TARGETS = {"distilbert": ["q_lin", "v_lin"], "modernbert": ["Wqkv"]}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model")


def _where_to_put(name: str) -> str:
    return (
        f"On a machine with network: `hf download {name} --local-dir models/{name.split('/')[-1]}` (or"
        " AutoModel/AutoTokenizer.from_pretrained(...).save_pretrained(folder)), copy the folder here and pass it:"
        f" --model.backbone models/{name.split('/')[-1]} --data.tokenizer models/{name.split('/')[-1]}"
    )


def _source(name: str, option: str) -> dict[str, Any]:
    """from_pretrained's arguments for `name`: a folder as it is, a hub name from the cache or the hub."""
    folder = Path(name)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise MissingFileError(
                f"{option} {name}: no config.json in the folder; give a folder written by save_pretrained."
            )
        return {"pretrained_model_name_or_path": str(folder)}
    if name.startswith((".", "/", "~")) or folder.suffix:
        raise MissingFileError(f"{option} {name}: no such folder. {_where_to_put(folder.name)}")
    try:  # already in the Hugging Face cache: no network needed
        AutoConfig.from_pretrained(name, local_files_only=True)
        return {"pretrained_model_name_or_path": name, "local_files_only": True}
    except OSError:
        pass
    if constants.HF_HUB_OFFLINE or not reachable(constants.ENDPOINT):
        raise MissingFileError(
            f"{option} {name}: no such folder, not in the Hugging Face cache ({constants.HF_HUB_CACHE}), and the"
            f" hub cannot be reached (offline?). {_where_to_put(name)}"
        )
    return {"pretrained_model_name_or_path": name}


def encoder_config(name: str) -> PretrainedConfig:
    """The configuration of encoder `name`, refused if it is no encoder."""
    config = AutoConfig.from_pretrained(**_source(name, "--model.backbone"))
    check_encoder(config, name)
    return config


def check_encoder(config: PretrainedConfig, name: str) -> None:
    if config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or config.is_encoder_decoder:
        raise ConfigError(
            f"--model.backbone {name}: a {config.model_type} model, not an encoder (no masked-language-model"
            " architecture); HFClassifier takes encoders such as BERT, DistilBERT, RoBERTa, DeBERTa, ModernBERT."
        )


def load_encoder(name: str, config: PretrainedConfig, pretrained: bool) -> PreTrainedModel:
    """The encoder `name` with its trained weights, or (`pretrained=False`) its architecture freshly initialized."""
    encoder = AutoModel.from_pretrained(**_source(name, "--model.backbone")) if pretrained else None
    encoder = (encoder or AutoModel.from_config(config)).train()  # from_pretrained leaves it in eval mode: no dropout
    if getattr(encoder, "pooler", None) is not None:  # BERT's next-sentence pooler: unused, untrained by the task
        encoder.pooler = None
    return encoder


def default_pooling(config: PretrainedConfig) -> str:
    return getattr(config, "classifier_pooling", None) or ("cls" if config.model_type in CLS_FAMILIES else "mean")


def default_lora_targets(config: PretrainedConfig, name: str) -> list[str]:
    targets = LORA_TARGETS.get(config.model_type) or TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(
        config.model_type
    )
    if not targets:
        raise ConfigError(
            f"--model.backbone {name}: no LoRA targets known for {config.model_type}; name its attention's"
            " projections: --model.lora_targets '[query, value]'."
        )
    return list(targets)


def load_tokenizer(name: str) -> Any:
    """The tokenizer saved with encoder `name` (a fast tokenizer: `tokenizers` is its backend)."""
    folder = Path(name)
    if folder.is_dir() and not any((folder / file).is_file() for file in TOKENIZER_FILES):
        raise MissingFileError(
            f"--data.tokenizer {name}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...) in the folder;"
            " save the encoder's tokenizer there: tokenizer.save_pretrained(folder)."
        )
    tokenizer = AutoTokenizer.from_pretrained(**_source(name, "--data.tokenizer"))
    if tokenizer.pad_token_id is None:
        raise ConfigError(f"--data.tokenizer {name}: the tokenizer has no padding token; an encoder's has one.")
    return tokenizer


def tokenizer_files(tokenizer: Any) -> dict[str, bytes]:
    """The files save_pretrained writes, by name: what a checkpoint carries to rebuild the tokenizer."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return {path.name: path.read_bytes() for path in Path(folder).iterdir() if path.is_file()}


def tokenizer_from_files(files: dict[str, bytes]) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        for name, content in files.items():
            (Path(folder) / name).write_bytes(content)
        return AutoTokenizer.from_pretrained(folder)
