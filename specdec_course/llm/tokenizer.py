"""SmolLM2's tokenizer, built from the GGUF file's own vocabulary, merges and chat template.

Byte-level BPE (GPT-2's scheme): text is UTF-8 bytes, each byte spelled as one printable
character, cut into words by a regular expression, and each word merged pair by pair in the
order of the 48,900 merges the file lists. SmolLM2 first splits every digit on its own
(llama.cpp's ``smollm`` pre-tokenizer, which the file names; Hugging Face's ``tokenizer.json``
for the model has ``Digits(individual_digits=True)``), then GPT-2's word regex. The 17 tokens
the file marks as control (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ...) are
matched whole. Built with the ``tokenizers`` library (the Rust tokenizer transformers wraps);
the chat template is the file's Jinja template, rendered with ``jinja2``.
"""

from __future__ import annotations

__all__ = ["GGUFTokenizer", "CONTROL"]

CONTROL = 3  # llama.cpp's token type for control tokens


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        from .gguf_load import INSTALL

        raise ImportError(f"the tokenizers package is not installed: {INSTALL}") from None
    return tokenizers


class GGUFTokenizer:
    """``encode(text) -> list[int]``, ``decode(ids) -> str``, ``apply_chat_template(messages)
    -> list[int]``; ``vocab_size``, ``eos_token_id`` (``<|im_end|>`` ends a chat turn: the
    ids a generation stops at are ``stop_ids``)."""

    def __init__(self, tok: dict):
        tk = _tokenizers()
        tokens = tok["tokens"]
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ")) for m in tok["merges"]]
        bpe = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges))
        if tok.get("pre") not in ("smollm", None):
            raise ValueError(f"pre-tokenizer {tok.get('pre')!r} is not SmolLM2's ('smollm')")
        bpe.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Digits(individual_digits=True),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        bpe.decoder = tk.decoders.ByteLevel()
        control = [t for t, ty in zip(tokens, tok["token_type"]) if ty == CONTROL]
        bpe.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in control])
        self._tk = bpe
        self.vocab_size = len(tokens)
        self.special_tokens = control
        self.bos_token_id = tok["bos_token_id"]
        self.eos_token_id = tok["eos_token_id"]
        self.chat_template = tok["chat_template"]
        im_end = vocab.get("<|im_end|>")
        self.stop_ids = tuple(i for i in (im_end, self.eos_token_id) if i is not None)
        self._template = None

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (control tokens written in it are matched whole)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str; got {type(text).__name__}")
        return self._tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """The text of ``ids`` (a list, 1-D tensor or array of ints), control tokens included."""
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids outside [0, {self.vocab_size}): {bad[:5]}")
        return self._tk.decode(ids, skip_special_tokens=False)

    def render_chat(self, messages, add_generation_prompt: bool = True) -> str:
        """The chat template's text for ``messages`` (a list of ``{"role", "content"}``)."""
        if (
            not isinstance(messages, list | tuple)
            or not messages
            or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)
        ):
            raise ValueError(
                'messages must be a non-empty list of {"role": ..., "content": ...} dicts, e.g. '
                '[{"role": "user", "content": "Hello"}]'
            )
        if self._template is None:
            import jinja2

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(self.chat_template)
        return self._template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt
        )

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """The ids of the model's chat template for ``messages``, ending with the assistant's
        turn opened (``<|im_start|>assistant\\n``) when ``add_generation_prompt``. A
        conversation without a system message gets the template's default one."""
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def __repr__(self) -> str:
        return (
            f"GGUFTokenizer(vocab_size={self.vocab_size}, bpe, {len(self.special_tokens)} control)"
        )
