"""Write examples/tiny-llama: a 2-layer Llama config and a character-level tokenizer with a
chat template. It is what `make demo` trains and what the tests train: small enough for a CPU
and needing nothing from the Hugging Face Hub. Run it again to regenerate the files.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).parent / "tiny-llama"
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}</s>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def main() -> None:
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    assert len(vocab) <= CONFIG["vocab_size"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>", chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    HERE.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(HERE))
    (HERE / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")


if __name__ == "__main__":
    main()
