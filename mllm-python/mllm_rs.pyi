"""mllm-rs from Python: load a .mllm or .gguf model, generate, stream, chat,
batch, tokenize, read logits as numpy arrays, convert and inspect files."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
from typing_extensions import TypedDict, Unpack

__version__: str

Prompt = Union[str, Sequence[int]]
Stop = Union[str, List[str], None]

class Sampling(TypedDict, total=False):
    """The keyword arguments of every generation method (all optional)."""

    max_tokens: int  # 256
    temperature: float  # 0: greedy
    top_k: int  # 0: off
    top_p: float  # 1: off
    min_p: float  # 0: off
    repetition_penalty: float  # 1: off
    seed: int
    stop: Stop  # the text ends before the first (not for generate_ids)
    ignore_eos: bool

class MllmError(Exception):
    """Base class of every error raised by mllm_rs."""

class BadFileError(MllmError):
    """A model file that cannot be opened or used."""

class InvalidInputError(MllmError):
    """An argument that cannot be used (empty prompt, unknown token id, bad sampling value, ...)."""

class ContextFullError(MllmError):
    """A sequence would grow past the model's context window."""

class TextIterator(Iterator[str]):
    """The pieces of text of one generation, as they are produced."""

    def __iter__(self) -> "TextIterator": ...
    def __next__(self) -> str: ...
    def close(self) -> None:
        """Stops the generation."""

class Model:
    """A language model loaded from a .mllm or .gguf file (None: the default SmolLM2-135M-Instruct)."""

    def __init__(self, path: Union[str, "PathLike[str]", None] = None, threads: Optional[int] = None) -> None: ...
    def generate(
        self,
        prompt: Prompt,
        **sampling: Unpack[Sampling],
    ) -> str:
        """The text generated after `prompt` (temperature 0: greedy)."""
    def generate_ids(
        self,
        prompt: Prompt,
        **sampling: Unpack[Sampling],
    ) -> List[int]:
        """Like generate, but the generated token ids (needs no tokenizer for id prompts)."""
    def stream(
        self,
        prompt: Prompt,
        **sampling: Unpack[Sampling],
    ) -> TextIterator:
        """Like generate, as an iterator over pieces of text."""
    def chat(
        self,
        messages: List[Dict[str, str]],
        **sampling: Unpack[Sampling],
    ) -> str:
        """The reply to OpenAI-style messages ({"role": ..., "content": ...}), with the model's chat template."""
    def generate_batch(
        self,
        prompts: List[Prompt],
        **sampling: Unpack[Sampling],
    ) -> List[str]:
        """One text per prompt, generated together in packed batches (sequence i samples with seed + i)."""
    def tokenize(self, text: str, add_special_tokens: bool = False) -> List[int]: ...
    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...
    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits after every position of `ids`: float32 array of shape [len(ids), vocab]."""
    @property
    def config(self) -> Dict[str, Any]: ...
    @property
    def eos_token_ids(self) -> List[int]: ...
    @property
    def max_context(self) -> int: ...
    @property
    def path(self) -> str: ...

def convert(
    src: Union[str, "PathLike[str]"],
    dst: Union[str, "PathLike[str]"],
    dtype: str = "f32",
    progress: bool = False,
) -> Dict[str, Any]:
    """Converts a Hugging Face model or a GGUF file into a .mllm file; returns what was written."""

def inspect(path: Union[str, "PathLike[str]"]) -> Dict[str, Any]:
    """Format, size, metadata and tensors of a .mllm or .gguf file."""
